"""Hypothesis strategies that draw shapes at tile boundaries (:mod:`mla_core.testing.shapes`).

Hypothesis is a test dependency (``pip install mla-core[test]``), imported when a strategy is built,
so importing this module never needs it. Each strategy mixes boundary values (most draws) with any
value in range (so shrinking still finds the smallest failing length)::

    from mla_core.testing import strategies as mst

    @given(lens=st.lists(mst.lengths([32, 16], limit=70), min_size=1, max_size=3))
    def test_decode(lens): ...
"""
from __future__ import annotations

from typing import Iterable

from . import shapes


def _st():
    from hypothesis import strategies  # lazy: hypothesis is only needed by the tests that draw

    return strategies


def _mixed(boundaries: list[int], lo: int, hi: int):
    """Mostly a boundary value, sometimes any integer in ``[lo, hi]``."""
    st = _st()
    pick = st.sampled_from(boundaries)
    return st.one_of(pick, pick, pick, st.integers(lo, hi)) if hi >= lo else pick


def lengths(tiles: Iterable[int], *, limit: int, multiples: Iterable[int] = (1, 2), extra: Iterable[int] = ()):
    """A length in ``0..limit``: mostly from :func:`~mla_core.testing.shapes.boundary_lengths` of ``tiles``."""
    return _mixed(shapes.boundary_lengths(tiles, limit=limit, multiples=multiples, extra=extra), 0, limit)


def split_lengths(num_splits: int, p_tile: int = 32, *, limit: int):
    """A decode length in ``0..limit``, mostly at a split-schedule edge (:func:`shapes.split_boundary_lengths`)."""
    return _mixed(shapes.split_boundary_lengths(num_splits, p_tile, limit=limit), 0, limit)


def decode_lengths_and_splits(*, limit: int, max_splits: int = 4, p_tile: int = 32):
    """``(num_kv_splits, length)``: a split count in ``1..max_splits`` and a length at one of its edges."""
    st = _st()
    return st.integers(1, max_splits).flatmap(
        lambda s: st.tuples(st.just(s), split_lengths(s, p_tile, limit=limit)))


def causal_pairs(block_m: int, block_n: int, *, limit: int | None = None):
    """A causal ``(len_q, len_k)`` from :func:`shapes.causal_boundary_pairs` (by construction on a key-tile edge)."""
    pairs = list(shapes.causal_boundary_pairs(block_m, block_n, limit=limit))
    if not pairs:
        raise ValueError(f"no causal boundary pair for block_m={block_m}, block_n={block_n} within limit {limit}")
    return _st().sampled_from(pairs)
