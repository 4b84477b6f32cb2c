"""Shapes that land on every tile boundary a kernel has, by construction.

A kernel that walks a length in tiles of ``T`` has its edge cases at ``k*T - 1``, ``k*T`` and
``k*T + 1``; lengths 0 and 1 are the degenerate rows. Every backend's tests draw their lengths from
here (with the tile sizes of the kernel under test: the 32-key decode P tile, each config's
BLOCK_M / BLOCK_N, the page size, split boundaries), so a new kernel is tested at its edges from the start.
"""
from __future__ import annotations

from typing import Iterable


def boundary_lengths(tiles: Iterable[int], *, limit: int | None = None, multiples: Iterable[int] = (1, 2),
                     extra: Iterable[int] = ()) -> list[int]:
    """0, 1, and ``k*T - 1, k*T, k*T + 1`` for every tile size ``T`` in ``tiles`` and ``k`` in ``multiples``.

    ``limit`` caps the lengths (inclusive); ``extra`` adds lengths of the caller's. Sorted, unique.
    """
    out = {0, 1, *extra}
    for tile in tiles:
        for k in multiples:
            out.update((k * tile - 1, k * tile, k * tile + 1))
    return sorted(n for n in out if n >= 0 and (limit is None or n <= limit))
