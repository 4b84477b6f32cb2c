"""The boundary-shape generators hit every tile edge they promise, by construction."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_core import numerics
from mla_core.testing import shapes
from mla_core.testing import strategies as mst


def at_edge(n: int, tiles, multiples=(1, 2)) -> bool:
    return n in (0, 1) or any(n - k * t in (-1, 0, 1) for t in tiles for k in multiples)


@pytest.mark.parametrize("tiles", [[32], [16, 64], [4, 32, 64], [1], [128]])
def test_boundary_lengths_are_all_at_an_edge_and_cover_every_edge(tiles):
    got = shapes.boundary_lengths(tiles)
    assert got == sorted(set(got)) and {0, 1} <= set(got)
    assert all(at_edge(n, tiles) for n in got)
    for t in tiles:
        for k in (1, 2):
            assert {k * t - 1, k * t, k * t + 1} <= set(got)


def test_boundary_lengths_limit_extra_and_generator_multiples():
    assert shapes.boundary_lengths([32], limit=33) == [0, 1, 31, 32, 33]
    assert 7 in shapes.boundary_lengths([32], extra=[7])
    # a one-shot iterable of multiples serves every tile, not just the first
    got = shapes.boundary_lengths([16, 32], multiples=iter([1, 3]))
    assert {15, 16, 17, 47, 48, 49, 31, 32, 33, 95, 96, 97} <= set(got)


def split_layout(length: int, splits: int):
    """(tiles_per_split, key count of each split) from numerics' schedule."""
    bounds = numerics.decode_split_bounds(length, splits)
    return numerics.decode_tiles_per_split(length, splits), [hi - lo for lo, hi in bounds]


@pytest.mark.parametrize("splits", [1, 2, 3, 4, 32])
def test_split_boundary_lengths_reach_each_schedule_edge(splits):
    tile = numerics.DECODE_P_TILE
    got = shapes.split_boundary_lengths(splits)
    assert {0, 1, tile - 1, tile, tile + 1, 2 * tile} <= set(got)
    assert all(n in (0, 1) or n % tile in (0, 1, tile - 1) for n in got)  # every length at a tile edge
    # every split full (tile count = split count), then one key more: the per-split tile count grows
    # and the last tile holds exactly one key (the last split too when the split count is even)
    full = splits * tile
    assert {full - 1, full, full + 1} <= set(got)
    t_full, sizes_full = split_layout(full, splits)
    t_more, sizes_more = split_layout(full + 1, splits)
    assert t_full == 1 and sizes_full == [tile] * splits
    assert t_more == 2 and sum(sizes_more) == full + 1
    if splits % 2 == 0:
        assert sizes_more[-1] == 1
    if splits > 1:  # one tile short of the split count: a split is left empty
        short = (splits - 1) * tile
        assert short in got and len(split_layout(short, splits)[1]) == splits - 1


def test_split_boundary_lengths_limit():
    assert max(shapes.split_boundary_lengths(4, limit=100)) <= 100
    with pytest.raises(ValueError):
        shapes.split_boundary_lengths(0)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (64, 16), (32, 64), (64, 64), (128, 64), (16, 128)])
def test_causal_pairs_put_a_full_query_tile_on_a_key_tile_edge(block_m, block_n):
    pairs = list(shapes.causal_boundary_pairs(block_m, block_n))
    assert len(pairs) == len(set(pairs)) >= 4
    for len_q, len_k in pairs:
        assert 0 < len_q < len_k
        key = shapes.causal_tile_edge(len_q, len_k, block_m, block_n)
        assert key is not None and key % block_n == 0 and key < len_k
        # the tile's last row sees exactly that key and no later one: a loop ending at `hi - 1` loses it
        m0 = next(m for m in range(0, len_q, block_m) if m + block_m - 1 + len_k - len_q == key)
        assert m0 + block_m <= len_q


def test_causal_pairs_include_the_issue_example():
    """len_q 64 / len_k 65 with block_n 16 (BLOCK_M 64): the case the skipped-last-key bug needed."""
    assert (64, 65) in set(shapes.causal_boundary_pairs(64, 16))


def test_causal_pairs_limit_and_edge_helper_rejects_misses():
    assert all(k <= 40 for _, k in shapes.causal_boundary_pairs(16, 16, limit=40))
    assert shapes.causal_tile_edge(64, 64, 64, 16) is None  # no shift: the diagonal, not a tile start
    assert shapes.causal_tile_edge(10, 30, 16, 16) is None  # no full query tile


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_strategies_draw_in_range_and_mostly_at_edges(data):
    n = data.draw(mst.lengths([32, 16], limit=70))
    assert 0 <= n <= 70
    splits, length = data.draw(mst.decode_lengths_and_splits(limit=140, max_splits=4))
    assert 1 <= splits <= 4 and 0 <= length <= 140
    len_q, len_k = data.draw(mst.causal_pairs(32, 16))
    assert shapes.causal_tile_edge(len_q, len_k, 32, 16) is not None


def test_strategies_module_imports_without_drawing():
    """Strategies build lazily; a module importing them needs hypothesis only when it draws."""
    import importlib
    import sys

    mod = importlib.reload(sys.modules["mla_core.testing.strategies"])
    assert "hypothesis" not in mod.__dict__
    with pytest.raises(ValueError):
        mst.causal_pairs(16, 16, limit=2)
