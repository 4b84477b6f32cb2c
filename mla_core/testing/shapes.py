"""Shapes that land on every tile boundary a kernel has, by construction.

A kernel that walks a length in tiles of ``T`` has its edge cases at ``k*T - 1``, ``k*T`` and
``k*T + 1``; lengths 0 and 1 are the degenerate rows. Every backend's tests draw their lengths from
here (with the tile sizes of the kernel under test: the 32-key decode P tile, each config's
BLOCK_M / BLOCK_N, the page size, split boundaries), so a new kernel is tested at its edges from the start.

* :func:`boundary_lengths`: lengths at the edges of the given tile sizes.
* :func:`split_boundary_lengths`: decode lengths at the edges of the split schedule (docs/numerics.md:
  ``tiles_per_split = ceil(ceil(L / p_tile) / num_splits)``): a tile count at a multiple of the split
  count, one tile more (the per-split count grows, the last split holds one key), one split left empty.
* :func:`causal_boundary_pairs`: ``(len_q, len_k)`` of a causal prefill whose query tile's last visible
  key is the first key of a key tile, so a kernel that stops one key early skips a whole tile.

Hypothesis strategies built on these are in :mod:`mla_core.testing.strategies`.
"""
from __future__ import annotations

from typing import Iterable, Iterator


def boundary_lengths(tiles: Iterable[int], *, limit: int | None = None, multiples: Iterable[int] = (1, 2),
                     extra: Iterable[int] = ()) -> list[int]:
    """0, 1, and ``k*T - 1, k*T, k*T + 1`` for every tile size ``T`` in ``tiles`` and ``k`` in ``multiples``.

    ``limit`` caps the lengths (inclusive); ``extra`` adds lengths of the caller's. Sorted, unique.
    """
    multiples = tuple(multiples)
    out = {0, 1, *extra}
    for tile in tiles:
        for k in multiples:
            out.update((k * tile - 1, k * tile, k * tile + 1))
    return sorted(n for n in out if n >= 0 and (limit is None or n <= limit))


def split_boundary_lengths(num_splits: int, p_tile: int = 32, *, limit: int | None = None,
                           multiples: Iterable[int] = (1, 2)) -> list[int]:
    """Decode KV lengths at the edges of the tile-aligned split schedule for ``num_splits`` splits.

    With ``t = ceil(ceil(L / p_tile) / num_splits)`` keys are split at multiples of ``p_tile * t``. The
    schedule changes where the tile count ``ceil(L / p_tile)`` crosses ``k * num_splits`` (each split full;
    one key more makes ``t`` grow and leaves a last split of one key) and where it is one short of the
    split count (``num_splits - 1`` tiles: a split left empty). Returned: those tile counts times
    ``p_tile`` (and +-1 key), plus :func:`boundary_lengths` of ``p_tile`` itself. Sorted, unique.
    """
    if num_splits < 1 or p_tile < 1:
        raise ValueError(f"num_splits and p_tile must be >= 1, got {num_splits}, {p_tile}")
    multiples = tuple(multiples)
    tile_counts = {k * num_splits for k in multiples} | {num_splits - 1, num_splits + 1}
    edges = [n * p_tile for n in tile_counts if n > 0]
    out = set(boundary_lengths([p_tile], multiples=multiples))
    for e in edges:
        out.update((e - 1, e, e + 1))
    return sorted(n for n in out if n >= 0 and (limit is None or n <= limit))


def causal_boundary_pairs(block_m: int, block_n: int, *, query_tiles: int = 2,
                          limit: int | None = None) -> Iterator[tuple[int, int]]:
    """``(len_q, len_k)`` with ``len_q < len_k`` where a causal query tile ends on a key-tile boundary.

    Query row ``i`` sees keys ``j <= i + shift`` (``shift = len_k - len_q``); the tile of rows
    ``[m0, m0 + block_m)`` sees keys up to ``m0 + block_m - 1 + shift``. Each pair puts that last key
    exactly on a multiple of ``block_n`` (the first key of a key tile) for a query tile that is full
    (``m0 + block_m <= len_q``) and a key that exists (``< len_k``): a kernel that ends its key loop one key
    early (``hi - 1``) skips that whole tile. For ``m0 = 0, block_m, ..`` (``query_tiles`` of them) the
    query length is the tile's end or one row more, and the shift the smallest positive one that lands
    on the boundary, and that plus ``block_n``. ``limit`` caps ``len_k``. Yields unique pairs, in order.
    """
    if block_m < 1 or block_n < 1:
        raise ValueError(f"block_m and block_n must be >= 1, got {block_m}, {block_n}")
    seen = set()
    for j in range(query_tiles):
        last_row = j * block_m + block_m - 1  # the tile's last query row
        first_shift = (-last_row) % block_n or block_n  # last_row + shift on a block_n multiple, shift >= 1
        for len_q in (last_row + 1, last_row + 2):
            for shift in (first_shift, first_shift + block_n):
                pair = (len_q, len_q + shift)
                if pair not in seen and (limit is None or pair[1] <= limit):
                    seen.add(pair)
                    yield pair


def causal_tile_edge(len_q: int, len_k: int, block_m: int, block_n: int) -> int | None:
    """The key-tile boundary a causal pair puts a full query tile's last visible key on, or None.

    The first ``m0`` (a multiple of ``block_m`` with ``m0 + block_m <= len_q``) whose last visible key
    ``m0 + block_m - 1 + len_k - len_q`` is a multiple of ``block_n`` below ``len_k``; that key is returned.
    """
    shift = len_k - len_q
    for m0 in range(0, len_q - block_m + 1, block_m):
        key = m0 + block_m - 1 + shift
        if key % block_n == 0 and 0 <= key < len_k:
            return key
    return None
