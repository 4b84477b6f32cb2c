"""mla_core.numerics against independent expectations: hand-written values, table look-ups and properties.

The tables below are built from the formats' definitions (sign, exponent, mantissa bits), not from
mla_core: E4M3 (fn) has 4 exponent bits (bias 7) and 3 mantissa bits, no infinities, and its top code
(exponent 15, mantissa 7) is NaN, so the largest value is 1.75 * 2^8 = 448. Rounding to a table value is
"nearest, ties to the even code"; for these formats the code of a non-negative value is its index in
the sorted table, so an even index is an even code.
"""
import bisect
import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from mla_core import numerics

E4M3_TABLE = sorted({(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                     for e in range(16) for m in range(8) if not (e == 15 and m == 7)})
E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E4M3_MIN_NORMAL = 2.0 ** -6


def round_table(v: float, table: list[float]) -> float:
    """Nearest table value to v (saturating at the table's end), ties to the even index; sign kept."""
    if math.isnan(v):
        return v
    a = abs(v)
    i = bisect.bisect_left(table, a)
    if i == len(table):
        r = table[-1]
    elif table[i] == a or i == 0:
        r = table[i]
    else:
        lo, hi = table[i - 1], table[i]
        if a - lo < hi - a:
            r = lo
        elif hi - a < a - lo:
            r = hi
        else:
            r = lo if (i - 1) % 2 == 0 else hi
    return math.copysign(r, v)


def naive_nvfp4(x: torch.Tensor, amax, dim: int) -> torch.Tensor:
    """Float64 NVFP4 QDQ with explicit loops over blocks of 16 along ``dim`` (tail block partial)."""
    g = 1.0 if amax is None else amax / (6 * 448)
    xt = x.double().movedim(dim, -1).contiguous()
    flat = xt.reshape(-1, xt.shape[-1])
    out = torch.empty_like(flat)
    n = flat.shape[1]
    for r in range(flat.shape[0]):
        for start in range(0, n, 16):
            block = flat[r, start:start + 16].tolist()
            s = round_table(max(abs(v) for v in block) / 6 / g, E4M3_TABLE) * g
            for j, v in enumerate(block):
                out[r, start + j] = 0.0 if s == 0 else round_table(v / s, E2M1_TABLE) * s
    return out.reshape(xt.shape).movedim(-1, dim)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.double(), b.double())


# ------------------------------------------------------------------------------------------------
# E2M1 and E4M3 rounding by hand


E2M1_CASES = [(0.0, 0.0), (0.2, 0.0), (0.25, 0.0), (0.26, 0.5), (0.5, 0.5), (0.75, 1.0), (1.0, 1.0), (1.25, 1.0),
              (1.3, 1.5), (1.75, 2.0), (2.5, 2.0), (2.6, 3.0), (3.5, 4.0), (4.9, 4.0), (5.0, 4.0), (5.1, 6.0),
              (6.0, 6.0), (6.5, 6.0), (1e9, 6.0), (math.inf, 6.0)]


@pytest.mark.parametrize("x,want", E2M1_CASES)
def test_e2m1_ladder_ties_and_saturation(x, want):
    got = numerics.round_e2m1(torch.tensor([x, -x]))
    assert got.tolist() == [want, -want]
    assert round_table(x, E2M1_TABLE) == want  # the test's own rounding agrees with the hand values


def test_e2m1_ladder_through_nvfp4_with_unit_scale():
    """A block whose max is 6 has scale e4m3(6 / 6) * 1 = 1, so its elements follow the bare E2M1 ladder."""
    cases = [(x, w) for x, w in E2M1_CASES if x <= 6]
    blocks = torch.zeros(len(cases), 16)
    blocks[:, 0] = 6.0
    blocks[:, 1] = torch.tensor([x for x, _ in cases])
    assert (numerics.nvfp4_block_scales(blocks) == 1.0).all()
    assert numerics.qdq_nvfp4(blocks)[:, 1].tolist() == [w for _, w in cases]
    assert numerics.qdq_nvfp4(-blocks)[:, 1].tolist() == [-w for _, w in cases]


FP8_CASES = [
    (1.0625, 1.0), (1.1875, 1.25), (17.0, 16.0), (19.0, 20.0),  # ties between normals go to the even mantissa
    (432.0, 448.0), (440.0, 448.0), (464.0, 448.0), (1e6, 448.0), (math.inf, 448.0),  # top code and saturation
    (2.0 ** -10, 0.0), (3 * 2.0 ** -10, 2.0 ** -8), (5 * 2.0 ** -10, 2.0 ** -8),  # subnormal ties (step 2^-9)
    (15 * 2.0 ** -10, 2.0 ** -6),  # the tie between the largest subnormal and the smallest normal
    (2.0 ** -12, 0.0), (0.3, 0.3125), (100.0, 96.0), (0.0, 0.0),
]


@pytest.mark.parametrize("x,want", FP8_CASES)
def test_fp8_round_to_nearest_even_and_saturation(x, want):
    assert numerics.round_e4m3(torch.tensor([x, -x])).tolist() == [want, -want]
    assert round_table(x, E4M3_TABLE) == want
    # amax None is scale 1; amax = 448 * 4 is scale 4 (a power of two, so exactly 4x the same ladder).
    assert numerics.qdq_fp8(torch.tensor([x])).tolist() == [want]
    assert numerics.qdq_fp8(torch.tensor([4 * x]), amax=448.0 * 4).tolist() == [4 * want]


def test_fp8_table_and_constants():
    assert len(E4M3_TABLE) == 127 and E4M3_TABLE[-1] == numerics.E4M3_MAX == 448.0
    assert tuple(E2M1_TABLE) == numerics.E2M1_VALUES and numerics.E2M1_MAX == 6.0
    values = torch.tensor(E4M3_TABLE)
    assert same(numerics.round_e4m3(values), values)  # every E4M3 value is a fixed point


def test_fp8_nan_stays_elementwise():
    got = numerics.qdq_fp8(torch.tensor([1.0, float("nan"), 3.3]), amax=10.0)
    assert got[1].isnan() and not got[[0, 2]].isnan().any()
    s = 10.0 / 448
    assert got[0].item() == pytest.approx(round_table(1.0 / s, E4M3_TABLE) * s, rel=1e-6)


def test_fp8_amax_none_vs_given():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 50
    assert same(numerics.qdq_fp8(x), numerics.round_e4m3(x))
    amax = float(x.abs().max())
    s = amax / 448
    want = torch.tensor([round_table(v / s, E4M3_TABLE) * s for v in x.double().tolist()], dtype=torch.float64)
    got = numerics.qdq_fp8(x, amax)
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=0)
    assert not same(got, numerics.qdq_fp8(x))  # the scale matters
    assert got.abs().max().item() == pytest.approx(amax, rel=1e-6)  # amax maps onto 448 * s


# ------------------------------------------------------------------------------------------------
# NVFP4 blocks


def test_nvfp4_all_zero_blocks_give_zero_not_nan():
    x = torch.zeros(3, 40)
    x[1, 16:32] = torch.linspace(-3, 3, 16)
    got = numerics.qdq_nvfp4(x)
    scales = numerics.nvfp4_block_scales(x)
    assert scales.shape == (3, 3)
    assert (scales[0] == 0).all() and (scales[1, [0, 2]] == 0).all() and scales[1, 1] > 0
    assert not got.isnan().any()
    assert (got[0] == 0).all() and (got[1, :16] == 0).all() and (got[1, 32:] == 0).all()
    assert same(got[1, 16:32], naive_nvfp4(x[1:2, 16:32], None, -1)[0])


def test_nvfp4_tiny_block_scale_underflows_to_zero():
    """max / 6 below half the smallest E4M3 subnormal (2^-10): the scale rounds to 0 and so does the block."""
    x = torch.full((16,), 5.0 * 2.0 ** -10)  # max / 6 < 2^-10
    assert numerics.nvfp4_block_scales(x).item() == 0.0
    assert (numerics.qdq_nvfp4(x) == 0).all()


def test_nvfp4_nan_poisons_only_its_block():
    x = torch.randn(48, generator=torch.Generator().manual_seed(1))
    x[20] = float("nan")
    got = numerics.qdq_nvfp4(x)
    assert got[16:32].isnan().all()
    assert not got[:16].isnan().any() and not got[32:].isnan().any()
    assert numerics.nvfp4_block_scales(x)[1].isnan()
    assert same(got[:16], naive_nvfp4(x[:16], None, 0))
    assert same(got[32:], naive_nvfp4(x[32:], None, 0))


def test_nvfp4_saturation_of_scale_and_values():
    """A block max beyond 6 * 448 * g saturates the scale at 448 g; elements then clamp at ±6 s."""
    x = torch.tensor([1e5, -5e4, 3000.0, 10.0] + [1.0] * 12)
    s = numerics.nvfp4_block_scales(x).item()
    assert s == 448.0
    got = numerics.qdq_nvfp4(x)
    assert got[:3].tolist() == [6 * 448.0, -6 * 448.0, 6 * 448.0]
    assert got[3].item() == 0.0 and (got[4:] == 0).all()  # 10 / 448 rounds to E2M1 0
    inf = numerics.qdq_nvfp4(torch.tensor([math.inf, 1.0, -math.inf] + [0.0] * 13))
    assert inf[[0, 2]].tolist() == [6 * 448.0, -6 * 448.0] and inf[1].item() == 0.0


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("amax", [None, 37.5])
def test_nvfp4_open_tail_blocks_along_any_axis(dim, amax):
    """Lengths 37 / 21 / 18 along the three axes: the last block of each holds 5 / 5 / 2 elements."""
    x = torch.randn(37, 21, 18, generator=torch.Generator().manual_seed(2)) * 3
    x[..., 0] *= 40  # uneven magnitudes so blocks get different scales
    got = numerics.qdq_nvfp4(x, amax, dim)
    assert got.dtype == torch.float32 and got.shape == x.shape
    want = naive_nvfp4(x, amax, dim)
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=0)
    n = x.shape[dim]
    scales = numerics.nvfp4_block_scales(x, amax, dim)
    assert scales.shape[dim] == -(-n // 16)
    # The tail block's scale comes from its own elements only (the open tail, not padded data).
    tail = x.movedim(dim, -1)[..., 16 * (n // 16):]
    g = 1.0 if amax is None else amax / 2688
    want_tail = torch.tensor([round_table(m / 6 / g, E4M3_TABLE) * g
                              for m in tail.abs().amax(-1).flatten().tolist()])
    assert torch.allclose(scales.movedim(dim, -1)[..., -1].flatten().double(), want_tail.double(), rtol=1e-6)


def test_nvfp4_amax_none_vs_given():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.01
    assert same(numerics.qdq_nvfp4(x, 6 * 448.0), numerics.qdq_nvfp4(x))  # g = 1 both ways
    # g = 2^-10: exactly the ladder of x * 2^10 scaled back (a power of two commutes with every rounding).
    assert same(numerics.qdq_nvfp4(x, 6 * 448.0 / 1024), numerics.qdq_nvfp4(x * 1024) / 1024)
    # Without an amax these small values use E4M3-subnormal block scales; a fitting amax does better.
    err_none = (numerics.qdq_nvfp4(x) - x).norm() / x.norm()
    err_amax = (numerics.qdq_nvfp4(x, float(x.abs().max())) - x).norm() / x.norm()
    assert err_amax < err_none


@pytest.mark.parametrize("amax", [None, 3.0, 100.0, 1e-14])
@pytest.mark.parametrize("dim", [-1, 0])
def test_nvfp4_unscaled_is_qdq_without_g_and_exact_in_bf16(amax, dim):
    """nvfp4_unscaled = e2m1(x / s) * code (the cuda prefill's pre-pass output): the block codes are E4M3 table
    values, the values exact in bf16 (an E2M1 value times an E4M3 code: <= 6 significant bits), and times g they are
    qdq_nvfp4 up to one float32 rounding; NaN blocks, zero blocks and saturation as qdq_nvfp4."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, 50, generator=g) * 3
    x[0, 0, :16] = 0.0
    x[1, 1, 5], x[2, 2, 7], x[3, 0, 9] = float("nan"), float("inf"), -1e30
    codes = numerics.nvfp4_block_codes(x, amax, dim)
    finite = codes[torch.isfinite(codes)]
    assert set(finite.tolist()) <= set(E4M3_TABLE)
    assert torch.equal((codes * numerics.nvfp4_global_scale(amax)).nan_to_num(-1.0),
                       numerics.nvfp4_block_scales(x, amax, dim).nan_to_num(-1.0))
    u, q = numerics.nvfp4_unscaled(x, amax, dim), numerics.qdq_nvfp4(x, amax, dim)
    assert torch.equal(u.isnan(), q.isnan())
    ok = ~u.isnan()
    assert torch.equal(u[ok].to(torch.bfloat16).float(), u[ok])
    gs = torch.tensor(numerics.nvfp4_global_scale(amax), dtype=torch.float32)
    back = (u * gs)[ok & (q != 0)]
    assert torch.all((back - q[ok & (q != 0)]).abs() <= q[ok & (q != 0)].abs() * 2.0 ** -23)
    assert torch.equal(u[ok] == 0, q[ok] == 0)


# ------------------------------------------------------------------------------------------------
# decode split bounds


def expected_split_bounds(length: int, splits: int) -> list[tuple[int, int]]:
    tiles = math.ceil(length / 32)
    per_split = math.ceil(tiles / splits)
    chunk = 32 * per_split
    return [(lo, min(lo + chunk, length)) for lo in range(0, length, chunk)] if length else []


@pytest.mark.parametrize("length", [0, 1, 31, 32, 33, 1000])
def test_decode_split_bounds_all_split_counts(length):
    for splits in list(range(1, 33)) + [40, 64, 127, 128]:
        bounds = numerics.decode_split_bounds(length, splits)
        assert bounds == expected_split_bounds(length, splits), (length, splits)
        assert numerics.decode_tiles_per_split(length, splits) == math.ceil(math.ceil(length / 32) / splits)
        assert len(bounds) <= splits
        assert all(lo % 32 == 0 and lo < hi for lo, hi in bounds)
        assert [lo for lo, _ in bounds[1:]] == [hi for _, hi in bounds[:-1]]  # contiguous, covering [0, L)
        assert (bounds[0][0], bounds[-1][1]) == (0, length) if length else bounds == []


def test_decode_split_bounds_by_hand():
    assert numerics.decode_split_bounds(1000, 3) == [(0, 352), (352, 704), (704, 1000)]
    assert numerics.decode_split_bounds(1000, 32) == [(32 * i, 32 * i + 32) for i in range(31)] + [(992, 1000)]
    assert numerics.decode_split_bounds(33, 32) == [(0, 32), (32, 33)]
    assert numerics.decode_split_bounds(33, 1) == [(0, 33)]
    assert numerics.decode_split_bounds(1000, 20) == [(64 * i, 64 * i + 64) for i in range(15)] + [(960, 1000)]
    assert numerics.decode_split_bounds(0, 7) == [] and numerics.decode_tiles_per_split(0, 7) == 0


# ------------------------------------------------------------------------------------------------
# properties (hypothesis)

FINITE = st.floats(min_value=-3e4, max_value=3e4, allow_nan=False, allow_infinity=False, width=32)
AMAX = st.one_of(st.none(), st.floats(min_value=1e-2, max_value=1e4, allow_nan=False, allow_infinity=False))
PROPS = settings(max_examples=80, deadline=None)


@st.composite
def blocked(draw):
    """(x [rows, n] float32, dim): 1..40 elements along the blocked axis (tails included)."""
    rows, n = draw(st.integers(1, 3)), draw(st.integers(1, 40))
    vals = draw(st.lists(FINITE, min_size=rows * n, max_size=rows * n))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e2]))  # block maxima across the E4M3 scale range
    x = torch.tensor(vals, dtype=torch.float32).reshape(rows, n) * scale
    dim = draw(st.sampled_from([-1, 1]))
    return (x, dim) if draw(st.booleans()) else (x.t().contiguous(), 0)


@PROPS
@given(st.lists(FINITE, min_size=1, max_size=64), AMAX)
def test_fp8_idempotent_symmetric_monotone(vals, amax):
    x = torch.tensor(vals, dtype=torch.float32)
    q = numerics.qdq_fp8(x, amax)
    assert same(numerics.qdq_fp8(q, amax), q)
    assert same(numerics.qdq_fp8(-x, amax), -q)
    order = torch.argsort(x)
    assert (q[order][1:] >= q[order][:-1]).all()
    s = numerics.fp8_scale(amax)
    assert torch.all(q.abs() <= 448 * s * (1 + 1e-6))


@PROPS
@given(blocked(), AMAX)
def test_nvfp4_properties(case, amax):
    x, dim = case
    g = numerics.nvfp4_global_scale(amax)
    q = numerics.qdq_nvfp4(x, amax, dim)
    s_blocks = numerics.nvfp4_block_scales(x, amax, dim)
    n = x.shape[dim]
    s = s_blocks.movedim(dim, -1).repeat_interleave(16, dim=-1)[..., :n].movedim(-1, dim)

    assert same(numerics.qdq_nvfp4(-x, amax, dim), -q)  # sign symmetry

    # Every block scale / g is an E4M3 value; every output / its block scale is an E2M1 value.
    for ratio, table in ((s_blocks.double() / g, E4M3_TABLE), ((q.double() / s.double())[s > 0], E2M1_TABLE)):
        for r in ratio.flatten().tolist():
            assert math.isclose(r, round_table(r, table), rel_tol=1e-6, abs_tol=1e-30), r
    assert (q[s == 0] == 0).all()

    # Error bound: at most half the E2M1 gap around x / s (0.25 below 2, 0.5 in [2, 4], 1.0 in [4, 6]);
    # beyond 6 s (a saturated or subnormal, coarse block scale) the value clamps to ±6 s.
    u = (x.double() / s.double()).abs()
    inside = (s > 0) & (u <= 6)
    half_gap = torch.where(u <= 2, 0.25, torch.where(u <= 4, 0.5, 1.0)) * s.double()
    err = (x.double() - q.double()).abs()
    assert torch.all(err[inside] <= half_gap[inside] * (1 + 1e-5))
    sat = (s > 0) & (u > 6)
    assert same(q[sat], torch.copysign(6 * s[sat], x[sat]))

    # Idempotence, for blocks with a normal E4M3 scale (s / g >= 2^-6): then the block maximum maps to
    # E2M1 6 and the re-derived scale is the same. A subnormal scale may round the maximum to 4 and shrink.
    q2 = numerics.qdq_nvfp4(q, amax, dim)
    normal = (s.double() / g >= E4M3_MIN_NORMAL) | (s == 0)
    assert same(q2[normal], q[normal])

    # Monotone within a block with its fixed scale: sorting a block's inputs sorts its outputs.
    xb, qb = x.movedim(dim, -1), q.movedim(dim, -1)
    for start in range(0, n, 16):
        xs, qs = xb[..., start:start + 16], qb[..., start:start + 16]
        order = torch.argsort(xs, dim=-1)
        sorted_q = torch.gather(qs, -1, order)
        assert (sorted_q[..., 1:] >= sorted_q[..., :-1]).all()


@PROPS
@given(st.lists(FINITE, min_size=16, max_size=16))
def test_nvfp4_block_matches_naive(vals):
    x = torch.tensor(vals, dtype=torch.float32)
    assume(x.abs().max() > 0)
    assert torch.allclose(numerics.qdq_nvfp4(x).double(), naive_nvfp4(x, None, -1), rtol=1e-6, atol=0)


def _tie_block(device="cpu"):
    """A block whose max / 6 / g is exactly the E4M3 tie 336 (between 320 and 352) for amax 4.9375.

    A reciprocal product (how PyTorch on CUDA divides by a host scalar) gives 336.00003 and rounds up.
    """
    return torch.full((16,), 3.703125, device=device)


def test_division_is_correctly_rounded_at_a_tie():
    g = numerics.nvfp4_global_scale(4.9375)
    x = torch.tensor(0.6171875)
    assert numerics.divide(x, g).item() == 336.0
    assert (x * (1.0 / torch.tensor(g))).item() != 336.0  # what a reciprocal product gives
    g32 = torch.tensor(g).item()
    assert numerics.nvfp4_block_scales(_tie_block(), 4.9375).item() == torch.tensor(320.0 * g32).item()


def test_recipe_quant_names_each_ops_quantized_tensors():
    """One definition of a recipe: decode's K, V, P (its keyword names), prefill's Q, K, V, P; bf16 quantizes none."""
    assert numerics.recipe_quant("fp8", "decode") == {"k_qdq": "fp8", "v_qdq": "fp8", "p_qdq": "fp8"}
    assert numerics.recipe_quant("nvfp4", "prefill") == dict.fromkeys(("q_quant", "k_quant", "v_quant", "p_quant"),
                                                                      "nvfp4")
    assert set(numerics.recipe_quant("bf16", "prefill").values()) == {None}
    with pytest.raises(ValueError, match="merge"):
        numerics.recipe_quant("fp8", "merge")
    with pytest.raises(KeyError):
        numerics.recipe_quant("int8", "decode")


@pytest.mark.gpu
def test_numerics_on_cuda_equal_cpu_at_division_ties():
    cpu = numerics.qdq_nvfp4(_tie_block(), 4.9375)
    assert torch.equal(numerics.qdq_nvfp4(_tie_block("cuda"), 4.9375).cpu(), cpu)
    x = torch.randn(1 << 16) * 3
    for amax in (4.9375, 0.37, None):
        assert torch.equal(numerics.qdq_fp8(x.cuda(), amax).cpu(), numerics.qdq_fp8(x, amax))
        assert torch.equal(numerics.qdq_nvfp4(x.cuda(), amax).cpu(), numerics.qdq_nvfp4(x, amax))
