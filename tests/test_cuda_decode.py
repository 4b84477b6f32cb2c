"""CUDA decode (csrc/mla_decode_mma.cuh: mma.sync, csrc/mla_decode_wgmma.cuh: WGMMA) against the reference backend,
on the GPU (``pytest -m gpu``).

DeepSeek sizes (kv_lora_rank 512, rope 64), heads 16, 64 and 128, pages 1/16/64, lengths on every 32- and
64-key tile edge plus 1000 and 32768, splits 1/32/auto, every recipe. Unreached cache rows hold NaN and
block-table entries past each length hold out-of-range garbage (tests/paged_inputs.py), so a kernel that
reads them fails; output buffers come from memory just filled with NaN, so an unwritten element fails.
Quantized cases also show the result is far from the unquantized reference. The ``kernels`` fixture records
which kernel each cuda call launched: the WGMMA kernel for bf16/fp16 with K and V unquantized or both FP8 with
one scale (any P: the fp8 recipe, FP8 K/V + NVFP4 P), the mma.sync kernel for every other recipe. An FP8 KV
cache (float8_e4m3fn codes + kv_scale, docs/numerics.md) runs on the WGMMA kernel: against the reference (codes
* kv_scale in float32) at the documented tolerance, every finite code bit-exact, unaligned rows, fp16 q, P
quantized, a CUDA graph.
"""
from __future__ import annotations

import functools

import pytest
import torch

import mla_core
from mla_core import numerics
from mla_core.testing.shapes import boundary_lengths, split_boundary_lengths
from paged_inputs import paged_decode_inputs

pytestmark = pytest.mark.gpu

RANK, ROPE = 512, 64
RECIPES = {"bf16": (None, None, None), "fp8": ("fp8", "fp8", "fp8"), "nvfp4": ("nvfp4", "nvfp4", "nvfp4"),
           "fp8_p_nvfp4": ("fp8", "fp8", "nvfp4")}
WGMMA_RECIPES = ("bf16", "fp8", "fp8_p_nvfp4")
"""Recipes the WGMMA kernel runs (K and V share its shared-memory tile: both off or both FP8)."""
# 0, 1, 15..17, 31..33, 63..65, 127..129, 1000, 32768: the 32-key P tiles, the 64-key steps (128: the keys-as-M
# kernel's two warpgroups alternate them) and its producer's 16-row runs (a warp's bulk copy)
LENGTHS = boundary_lengths([16, 32, 64], extra=(1000, 32768))


@functools.lru_cache(maxsize=4)
def _inputs(lengths: tuple, heads: int, page_size: int, dtype=torch.bfloat16, seed=0):
    return tuple(paged_decode_inputs(list(lengths), heads, RANK + ROPE, page_size, dtype, seed=seed, device="cuda"))


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _unaligned_rows(cache):
    """``cache``'s values as a column slice of a tensor one column wider: rows not 16-byte aligned (the producer's
    element / byte path instead of TMA or cp.async), the extra column NaN (0x7F codes for an FP8 cache)."""
    fp8 = cache.dtype == torch.float8_e4m3fn
    raw = cache.view(torch.uint8) if fp8 else cache
    wide = torch.full((*raw.shape[:2], RANK + ROPE + 1), 0x7F if fp8 else float("nan"), dtype=raw.dtype,
                      device=raw.device)
    wide[..., 1:] = raw
    return wide[..., 1:].view(torch.float8_e4m3fn) if fp8 else wide[..., 1:]


def _poison_allocator():
    """Fill recently freed allocator memory with NaN, so buffers the next call allocates start as NaN."""
    junk = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MB
    del junk


def decode(backend, inputs, **kw):
    q, cache, table, lens = inputs
    kw.setdefault("softmax_scale", (RANK + ROPE) ** -0.5)
    if backend == "cuda":
        _poison_allocator()
    return mla_core.mla_attention_decode(q, cache, table, lens, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                                         backend=backend, **kw)


def check(inputs, tol=1e-2, quantized=False, lens=None, **kw):
    """cuda vs reference (out and LSE); ``quantized``: also far from the unquantized reference."""
    out, lse = decode("cuda", inputs, **kw)
    ref, ref_lse = decode("reference", inputs, **kw)
    assert out.dtype == ref.dtype and out.shape == ref.shape and lse.shape == ref_lse.shape
    assert not torch.isnan(out).any(), "NaN in out"
    assert not torch.isnan(lse).any(), "NaN in lse"
    lens = (inputs[3] if lens is None else lens).to(out.device)
    empty = lens == 0
    assert (out[empty] == 0).all() and (lse[empty] == float("-inf")).all()
    if (~empty).any():
        err = rel_l2(out[~empty], ref[~empty])
        per_request = [f"{rel_l2(out[i], ref[i]):.1e}" for i in range(out.shape[0]) if not empty[i]]
        assert err < tol, f"rel L2 {err:.2e} >= {tol}; per request {per_request}"
        lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item()
        assert lse_err < 1e-3, f"LSE off by {lse_err:.2e}"
        if quantized:
            plain = {k: v for k, v in kw.items() if not k.endswith(("_qdq", "_qdq_amax"))}
            unq, _ = decode("reference", inputs, **plain)
            far = rel_l2(out[~empty], unq[~empty])
            assert far > 10 * max(err, tol / 10), f"quantized output {far:.2e} from the unquantized one (err {err:.2e})"
    return out, lse


class _Launches:
    """The extension module, recording which kernel each launch entry ran into ``seen``."""

    def __init__(self, module, seen):
        self._module, self._seen = module, seen

    def __getattr__(self, name):
        fn = getattr(self._module, name)
        kernel = {"decode": "mma.sync", "decode_wgmma": "wgmma"}.get(name)
        if kernel is None:
            return fn

        def launch(*args, **kw):
            self._seen.append(kernel)
            return fn(*args, **kw)
        return launch


@pytest.fixture
def kernels(monkeypatch):
    """The kernel each cuda decode call launched from here on ("wgmma" or "mma.sync"); no autotune cache read
    (the default config runs)."""
    from mla_core_cuda import decode as launcher
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")
    seen = []
    real = launcher.run

    def spy(module, call, config):
        return real(_Launches(module, seen), call, config)

    monkeypatch.setattr(launcher, "run", spy)
    return seen


def _expected_kernel(heads, recipe="bf16"):
    """The default kernel: WGMMA for the recipes whose K and V share codes (any head count), else mma.sync."""
    return "wgmma" if recipe in WGMMA_RECIPES else "mma.sync"


def test_backend_available():
    backend = mla_core.get_backend("cuda")
    assert backend.unavailable_reason() is None


@pytest.mark.parametrize("splits", [1, 32, "auto"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads", [16, 64, 128])
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4", "fp8_p_nvfp4"])
def test_deepseek(recipe, heads, page_size, splits, kernels):
    k, v, p = RECIPES[recipe]
    inputs = _inputs(tuple(LENGTHS), heads, page_size)
    check(inputs, quantized=recipe != "bf16", k_qdq=k, v_qdq=v, p_qdq=p, num_kv_splits=splits)
    assert kernels == [_expected_kernel(heads, recipe)]


@pytest.mark.parametrize("heads", [1, 20, 64, 65, 127, 128])  # the WGMMA kernel's 64-head groups: edges and padding
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_heads_and_out_dtypes(heads, out_dtype, kernels):
    inputs = _inputs((1, 700, 0, 64), heads, 16)
    check(inputs, k_qdq="nvfp4", v_qdq="fp8", p_qdq="fp8", num_kv_splits=5, out_dtype=out_dtype, quantized=True)
    check(inputs, num_kv_splits=1, out_dtype=out_dtype)
    check(inputs, num_kv_splits=3, out_dtype=out_dtype)
    check(inputs, k_qdq="fp8", v_qdq="fp8", p_qdq="nvfp4", num_kv_splits=3, out_dtype=out_dtype, quantized=True)
    check(inputs, p_qdq="nvfp4", num_kv_splits=1, out_dtype=out_dtype, quantized=True)
    check(inputs, p_qdq="fp8", p_qdq_amax=0.5, num_kv_splits=2, out_dtype=out_dtype, quantized=True)
    assert kernels == ["mma.sync"] + ["wgmma"] * 5


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4", "fp8_p_nvfp4"])
def test_fp16_cache(recipe, heads, kernels):
    k, v, p = RECIPES[recipe]
    inputs = _inputs((2000, 1, 33), heads, 16, torch.float16)
    check(inputs, quantized=recipe != "bf16", k_qdq=k, v_qdq=v, p_qdq=p, num_kv_splits=3)
    check(inputs, quantized=recipe != "bf16", k_qdq=k, v_qdq=v, p_qdq=p, num_kv_splits=1, out_dtype=torch.float32)
    assert kernels == [_expected_kernel(heads, recipe)] * 2


@pytest.mark.parametrize("heads", [20, 64, 128])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_every_config_against_reference(heads, out_dtype):
    """Every config of an unquantized problem (the WGMMA kernel, at >= 64 heads its four-slot ring, bit-equal to it,
    and each mma.sync CTA shape) against the reference, with split starts off the 64-key steps (2049 keys: 4 splits
    of 17 tiles start at 544, 1088, 1632) and lengths around them; the two kernels also agree with each other to the
    output's rounding."""
    from mla_core.specs import validate_decode
    from mla_core_cuda import build, decode as launcher
    inputs = _inputs((1000, 63, 64, 65, 129, 0, 2049), heads, 16)
    problem, call = validate_decode(*inputs, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                                    qk_rope_head_dim=ROPE, page_size=None, num_kv_splits=4, k_qdq=None,
                                    k_qdq_amax=None, v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0,
                                    return_lse=True, out_dtype=out_dtype)
    configs = launcher.configs(problem)
    assert configs[0] == {"kernel": "wgmma"} and len(configs) == (5 if heads > 32 else 4) + (heads >= 64)
    ref, ref_lse = decode("reference", inputs, num_kv_splits=4, out_dtype=out_dtype)
    module = build.build()
    lens = inputs[3]
    outs = []
    for config in configs:
        _poison_allocator()
        out, lse = launcher.run(module, call, config)
        assert not torch.isnan(out).any() and not torch.isnan(lse).any(), config
        assert (out[lens == 0] == 0).all() and (lse[lens == 0] == float("-inf")).all(), config
        assert rel_l2(out[lens > 0], ref[lens > 0]) < 1e-2, config
        assert (lse[lens > 0] - ref_lse[lens > 0]).abs().max().item() < 1e-3, config
        if config == launcher.RING4:  # schedule Q1 on four ring slots: the default's bits
            assert torch.equal(out, outs[0]), config
        outs.append(out)
    for out in outs[1:]:
        assert rel_l2(out, outs[0]) < (1e-2 if out_dtype == torch.bfloat16 else 1e-3)


def test_wgmma_caller_buffers_and_no_lse(kernels):
    """The WGMMA kernel through the FlashInfer-compatible dense path: caller-given out / lse buffers (NaN
    first) are filled, and return_lse=False returns the output alone."""
    from mla_core.compat.flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
    q, cache, table, lens = _inputs((1000, 1, 0, 65), 128, 64)
    out = torch.full((q.shape[0], 1, 128, RANK), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((q.shape[0], 1, 128), float("nan"), dtype=torch.float32, device="cuda")
    args = (q[:, None], cache, torch.empty(1, device="cuda"), 128, RANK, ROPE, table, lens, 1000)
    got, got_lse = trtllm_batch_decode_with_kv_cache_mla(*args, out=out, lse=lse, bmm1_scale=0.04,
                                                         return_lse=True, backend="cuda")
    assert got.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    ref, ref_lse = decode("reference", (q, cache, table, lens), softmax_scale=0.04, num_kv_splits=32)
    assert rel_l2(out[:, 0][lens > 0], ref[lens > 0]) < 1e-2 and (out[:, 0][lens == 0] == 0).all()
    finite = lens > 0
    assert (lse[:, 0][finite] - ref_lse[finite]).abs().max().item() < 1e-3
    assert (lse[:, 0][~finite] == float("inf")).all()  # FlashInfer's empty-row LSE
    alone = trtllm_batch_decode_with_kv_cache_mla(*args, bmm1_scale=0.04, backend="cuda")
    assert torch.equal(alone, out)
    plain, none = mla_core.mla_attention_decode(q, cache, table, lens, softmax_scale=0.04, return_lse=False,
                                                backend="cuda")
    assert none is None and torch.equal(plain, out[:, 0])
    assert kernels == ["wgmma"] * 3


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_calibrated_amax(recipe, kernels):
    """Per-tensor amaxes that put many values on rounding ties (26.88 gives an NVFP4 g of 0.01). FP8 K and V
    with two scales run the mma.sync kernel under the WGMMA config (their codes differ on the shared columns);
    with one scale (V = K codes) the WGMMA kernel."""
    k, v, p = RECIPES[recipe]
    inputs = _inputs((1000, 129), 128, 16)
    check(inputs, quantized=True, k_qdq=k, k_qdq_amax=26.88, v_qdq=v, v_qdq_amax=4.48, p_qdq=p, p_qdq_amax=0.5,
          num_kv_splits=4)
    check(inputs, quantized=True, k_qdq="fp8", k_qdq_amax=3.0, v_qdq="fp8", v_qdq_amax=3.0, p_qdq=p)  # V = K codes
    check(inputs, quantized=True, k_qdq="fp8", k_qdq_amax=26.88, v_qdq="fp8", v_qdq_amax=26.88, p_qdq=p,
          p_qdq_amax=0.5, num_kv_splits=3)
    assert kernels == ["mma.sync", "wgmma", "wgmma"]


def test_exact_division_scales(kernels):
    """Per-tensor factors outside the division-free range (EXACT_DIV_FREE_RANGE): with K and V unquantized, P's
    quotients by __fdiv_rn in the WGMMA consumers; with FP8 K/V the flag would reach the WGMMA producer's
    conversion (division-free only), so such a call runs the mma.sync kernel."""
    inputs = _inputs((1000, 129, 0), 128, 16)
    check(inputs, quantized=True, p_qdq="fp8", p_qdq_amax=1e-13, num_kv_splits=3)
    check(inputs, quantized=True, p_qdq="nvfp4", p_qdq_amax=1e-13, num_kv_splits=2)
    check(inputs, quantized=True, k_qdq="fp8", v_qdq="fp8", p_qdq="nvfp4", p_qdq_amax=1e-13, num_kv_splits=2)
    check(inputs, k_qdq="fp8", k_qdq_amax=1e24, v_qdq="fp8", v_qdq_amax=1e24, p_qdq="fp8", num_kv_splits=2)
    assert kernels == ["wgmma", "wgmma", "mma.sync", "mma.sync"]


@pytest.mark.parametrize("recipe", ["fp8", "fp8_p_nvfp4"])
@pytest.mark.parametrize("heads", [16, 128])
def test_wgmma_recipes_agree_with_mma_sync(recipe, heads):
    """The two kernels quantize with the same device rules (csrc/qdq.cuh): float32 outputs agree far below the
    quantization error (only a P or K code on a rounding edge can differ, where the float32 scores' summation
    order differs)."""
    from mla_core.specs import validate_decode
    from mla_core_cuda import build, decode as launcher
    k, v, p = RECIPES[recipe]
    inputs = _inputs((1000, 129, 1, 64), heads, 16)
    problem, call = validate_decode(*inputs, softmax_scale=0.04, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                                    page_size=None, num_kv_splits=3, k_qdq=k, k_qdq_amax=None, v_qdq=v,
                                    v_qdq_amax=None, p_qdq=p, p_qdq_amax=1.0, return_lse=True,
                                    out_dtype=torch.float32)
    configs = launcher.configs(problem)
    assert configs[0] == {"kernel": "wgmma"}
    module = build.build()
    (w_out, w_lse), (m_out, m_lse) = (launcher.run(module, call, c) for c in configs[:2])
    assert rel_l2(w_out, m_out) < 2e-3 and (w_lse - m_lse).abs().max().item() < 1e-4


@pytest.mark.parametrize("heads", [16, 64])
def test_index_dtypes_and_strides(heads, kernels):
    """int64 table and lengths, a cache whose rows are not 16-byte aligned (a column slice of a wider
    tensor), q a head slice of a larger tensor (and one whose rows are not 16-byte aligned)."""
    q, cache, table, lens = _inputs((300, 17, 0), heads, 16)
    sliced = _unaligned_rows(cache)
    g = torch.Generator().manual_seed(1)
    q_big = torch.randn(q.shape[0], 2 * heads, q.shape[2], generator=g).to("cuda", q.dtype)
    q_big[:, heads // 2:heads // 2 + heads] = q
    q_wide = torch.randn(q.shape[0], heads, 577, generator=g).to("cuda", q.dtype)
    q_wide[..., 1:] = q
    out_ref, _ = check((q, cache, table, lens), num_kv_splits=2)
    out_a, _ = check((q, sliced, table.long(), lens.long()), num_kv_splits=2)
    out_b, _ = check((q_big[:, heads // 2:heads // 2 + heads], cache, table, lens), num_kv_splits=2)
    out_c, _ = check((q_wide[..., 1:], sliced, table, lens.long()), num_kv_splits=2)
    assert torch.equal(out_a, out_ref) and torch.equal(out_b, out_ref) and torch.equal(out_c, out_ref)
    assert kernels == [_expected_kernel(heads)] * 4


@pytest.mark.parametrize("page_size", [3, 48, 100])
@pytest.mark.parametrize("heads", [16, 128])
def test_odd_page_sizes(page_size, heads, kernels):
    """Page sizes that are no power of two: the WGMMA kernel's row lookup by a float64 reciprocal with exact
    corrections (powers of two take a shift), lengths on and off page and step edges."""
    inputs = _inputs((1000, 3, 0, 301, 64), heads, page_size)
    check(inputs, num_kv_splits=3)
    check(inputs, num_kv_splits=1)
    assert kernels == ["wgmma"] * 2


@pytest.mark.parametrize("page_size", [32, 256])
@pytest.mark.parametrize("heads", [64, 128])
def test_tma_boxes_pages_and_padded_pages(heads, page_size, kernels):
    """The producer's TMA boxes (a warp's 16 rows, all present, of one page; a power-of-two page_size >= 16): a step
    over two pages (32) or a page over four steps (256), lengths ending inside a warp's rows (the warp falls back to
    zero-filling copies) and the cache's pages padded apart with NaN rows (the map bounds a box by page_size, not by
    the page stride): the same result as the contiguous cache."""
    inputs = _inputs((1000, 3, 0, 301, 64, 129), heads, page_size)
    out, lse = check(inputs, num_kv_splits=3)
    q, cache, table, lens = inputs
    padded = torch.full((cache.shape[0], page_size + 8, cache.shape[2]), float("nan"), dtype=cache.dtype,
                        device="cuda")
    padded[:, :page_size] = cache
    out_padded, lse_padded = check((q, padded[:, :page_size], table, lens), num_kv_splits=3)
    assert torch.equal(out_padded, out) and torch.equal(lse_padded, lse)
    assert kernels == ["wgmma"] * 2


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("recipe", ["fp8", "fp8_p_nvfp4"])
def test_fp8_recipe_tma_boxes_and_fallback(monkeypatch, recipe, heads, page_size, kernels):
    """K = V FP8 on the producer's TMA boxes (round s): a warp whose 16 rows are all present loads them by TMA, waits
    on its own landed barrier and converts them in place; lengths ending inside a warp's rows, a page outside the cache
    in mid-request (page 16: one warp of one step falls back, and its later steps' landed waits must still find
    their phase) and a cache whose rows are not 16-byte aligned (no TMA at all) keep the cp.async / element path. The
    conversion is elementwise: both paths give the same bits. Page 33 (no power of two): the cp.async path."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    k, v, p = RECIPES[recipe]
    kw = dict(k_qdq=k, v_qdq=v, p_qdq=p)
    q, cache, table, lens = _inputs((1000, 3, 0, 301, 64, 129, 2048), heads, page_size)
    table = table.clone()
    table[0, 80 // page_size] = 10 ** 9  # request 0's keys 80-95 (page 64: its whole second page) absent
    out, lse = check((q, cache, table, lens), quantized=True, num_kv_splits=3, **kw)
    out_u, lse_u = check((q, _unaligned_rows(cache), table, lens), quantized=True, num_kv_splits=3, **kw)
    assert torch.equal(out_u, out) and torch.equal(lse_u, lse)
    check(_inputs((1000, 3, 0, 301, 64, 129), heads, 33), quantized=True, num_kv_splits=3, **kw)
    assert kernels == ["wgmma"] * 3


def test_fp8_recipe_tma_landed_phase_after_fallback_from_dram(monkeypatch, kernels):
    """A warp's landed barrier completes one phase per TMA step only: after a step whose rows fall back to cp.async
    (every request's second page is outside the cache: step 1, stage 1), each later wait on stage 1 must still find
    its own boxes' phase. The pages lie scattered over a ~600 MB cache (beyond the L2), so the boxes come from DRAM
    while the next step's table lookups hit the L2: a wait that passed at once would convert rows before they land
    (31 such steps in each of the 32 CTAs)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    k, v, p = RECIPES["fp8"]
    q, cache, table, lens = _inputs((4096,) * 32, 16, 64)
    spread_pages = 8192
    where = torch.randperm(spread_pages, generator=torch.Generator().manual_seed(1))[:cache.shape[0]].to("cuda")
    spread = torch.full((spread_pages, *cache.shape[1:]), float("nan"), dtype=cache.dtype, device="cuda")
    spread[where] = cache
    table = table.clone()
    table[:, :64] = where[table[:, :64].long()].to(table.dtype)
    table[:, 1] = 10 ** 9
    check((q, spread, table, lens), quantized=True, num_kv_splits=1, k_qdq=k, v_qdq=v, p_qdq=p)
    assert kernels == ["wgmma"]


@pytest.mark.parametrize("heads", [16, 128])
def test_unchecked_metadata_is_masked_and_clamped(monkeypatch, heads, kernels):
    """With content checks off, a length past the table's capacity is clamped to it, and table entries within
    a length that point outside the cache are absent keys (what the reference does); request 1's first 32 keys
    (a whole P tile, the first half of a 64-key step) are all absent."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    q, cache, table, lens = _inputs((100, 64, 40), heads, 16)
    cache = cache.nan_to_num(0.0)  # the clamped request reaches the tail rows of its last page
    width = table.shape[1]
    table = table.clone()
    table[0, 1] = 10 ** 9
    table[1, 0] = -5
    table[1, 1] = 10 ** 9
    capacity = width * 16
    long_lens = torch.tensor([2 ** 31 - 1, 64, 40], dtype=torch.int32, device="cuda")
    clamped = torch.tensor([capacity, 64, 40], dtype=torch.int32, device="cuda")
    out, lse = decode("cuda", (q, cache, table, long_lens), num_kv_splits=3)
    # clamped, request 0 also reaches the garbage entries past its pages (huge and negative): absent keys
    ref, ref_lse = decode("reference", (q, cache, table, clamped), num_kv_splits=3)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert rel_l2(out, ref) < 1e-2
    assert (lse - ref_lse).abs().max().item() < 1e-3
    assert kernels == [_expected_kernel(heads)]


def test_head_tiles_agree():
    """Every CTA shape gives the same numbers: scores, maxima and P codes are computed alike; only the row
    sum's order differs (float32 rounding), so the float32 outputs agree to ~1e-7 (bf16 outputs would differ
    by the odd rounding flip: 2.4e-5 rel L2 seen on the H200)."""
    from mla_core.specs import validate_decode
    from mla_core_cuda import build, decode as launcher
    inputs = _inputs((1000, 129), 128, 16)
    problem, call = validate_decode(*inputs, softmax_scale=0.04, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                                    page_size=None, num_kv_splits=4, k_qdq="nvfp4", k_qdq_amax=None, v_qdq="nvfp4",
                                    v_qdq_amax=None, p_qdq="nvfp4", p_qdq_amax=1.0, return_lse=True,
                                    out_dtype=torch.float32)
    module = build.build()
    outs = [launcher.run(module, call, config) for config in launcher.configs(problem)]
    for out, lse in outs[1:]:
        assert rel_l2(out, outs[0][0]) < 1e-5 and rel_l2(lse, outs[0][1]) < 1e-6


def _check_graph_replay(q, cache, table, lens, kw):
    """Decode captured in a CUDA graph (after a warm-up call on a side stream) and replayed into a NaN-poisoned
    output equals the eager call bit for bit, and new inputs copied into the static query give the new result."""
    eager, eager_lse = mla_core.mla_attention_decode(q, cache, table, lens, **kw)
    static_q = q.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mla_core.mla_attention_decode(static_q, cache, table, lens, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = mla_core.mla_attention_decode(static_q, cache, table, lens, **kw)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)
    static_q.copy_(q * 0.5)  # new inputs, same graph
    graph.replay()
    want, _ = mla_core.mla_attention_decode(q * 0.5, cache, table, lens, **kw)
    assert torch.equal(out, want)


@pytest.mark.parametrize("recipe", ["fp8_p_nvfp4", "fp8", "nvfp4", "bf16"])
def test_cuda_graph_capture(recipe, kernels):
    """Captured and replayed (the WGMMA kernel unquantized and with FP8 K/V, the mma.sync kernel with the nvfp4
    recipe): the same numbers as eager, and new inputs in the static buffers give the new result."""
    q, cache, table, lens = _inputs((100, 3000, 1, 0), 128, 64)
    k, v, p = RECIPES[recipe]
    quant = dict(k_qdq=k, v_qdq=v, p_qdq=p, k_qdq_amax=4.0, v_qdq_amax=4.0) if recipe != "bf16" else {}
    kw = dict(softmax_scale=0.04, kv_lora_rank=RANK, qk_rope_head_dim=ROPE, num_kv_splits=8, backend="cuda", **quant)
    _check_graph_replay(q, cache, table, lens, kw)
    assert set(kernels) == {_expected_kernel(128, recipe)}


@pytest.mark.parametrize("heads", [16, 128])
def test_torch_compile_fullgraph(heads):
    q, cache, table, lens = _inputs((100, 33), heads, 16)

    def step(q, cache, table, lens):
        out, lse = mla_core.mla_attention_decode(q, cache, table, lens, softmax_scale=0.04, num_kv_splits=4,
                                                 backend="cuda")
        return out.float() * 2, lse

    torch._dynamo.reset()
    got, got_lse = torch.compile(step, fullgraph=True)(q, cache, table, lens)
    want, want_lse = step(q, cache, table, lens)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)


# ------------------------------------------------------------------------------------------- FP8 KV cache

KV_SCALE = 0.0123  # not a power of two: code * kv_scale rounds in float32 (as tests/test_kv_fp8.py)
FP8 = torch.float8_e4m3fn


@functools.lru_cache(maxsize=4)
def _fp8_inputs(lengths: tuple, heads: int, page_size: int, q_dtype=torch.bfloat16, seed=0):
    """The E4M3 codes of random values at KV_SCALE (|code| up to ~350, some subnormal codes); rows no request
    reaches hold NaN codes and table entries past each length garbage (tests/paged_inputs.py)."""
    q, cache, table, lens = paged_decode_inputs(list(lengths), heads, RANK + ROPE, page_size, torch.float32,
                                                q_dtype, seed=seed, device="cuda")
    return q, (cache / KV_SCALE).clamp(-448, 448).to(FP8), table, lens


@pytest.mark.parametrize("splits", [1, 3, 32, "auto"])
@pytest.mark.parametrize("page_size", [1, 16, 33, 64])
@pytest.mark.parametrize("heads", [16, 128])
def test_fp8_cache(heads, page_size, splits, kernels):
    """FP8 cache on the WGMMA kernel against the reference: float32 output within the documented 1e-3 rel L2,
    bf16 output within its rounding; lengths on every 32- and 64-key edge (0, 1, tile +- 1), 1000, 32768."""
    inputs = _fp8_inputs(tuple(LENGTHS), heads, page_size)
    check(inputs, tol=1e-3, kv_scale=KV_SCALE, num_kv_splits=splits, out_dtype=torch.float32)
    out, _ = check(inputs, kv_scale=KV_SCALE, num_kv_splits=splits)
    assert out.dtype == torch.bfloat16 and kernels == ["wgmma"] * 2


@pytest.mark.parametrize("heads", [16, 128])
def test_fp8_cache_fp16_q_and_p_qdq(heads, kernels):
    """fp16 q (codes converted to fp16, P rounded to fp16), and P fake-quantized (FP8, NVFP4) over an FP8 cache."""
    for q_dtype in (torch.float16, torch.bfloat16):
        inputs = _fp8_inputs((2000, 1, 33, 0, 65), heads, 16, q_dtype)
        check(inputs, tol=1e-3, kv_scale=KV_SCALE, num_kv_splits=3, out_dtype=torch.float32)
        out, _ = check(inputs, kv_scale=KV_SCALE, num_kv_splits=1)
        assert out.dtype == q_dtype
        check(inputs, quantized=True, kv_scale=KV_SCALE, p_qdq="fp8", p_qdq_amax=0.5, num_kv_splits=2)
        check(inputs, quantized=True, kv_scale=KV_SCALE, p_qdq="nvfp4", num_kv_splits=1, out_dtype=torch.float32)
    assert kernels == ["wgmma"] * 8


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_fp8_cache_codes_exact(q_dtype, heads, kernels):
    """Every finite code converts exactly, in every row and column of a step: each request is 64 equal rows
    (every producer warp, row group and lane converts them), so every key scores the same, P = 1, l = 64, and the
    float32 output is (64 code) * (kv_scale / 64) = float32(code * kv_scale), the cache's value, bit for bit; the
    254 finite codes in a different order per request fill the 512 V columns (rope: the random tests)."""
    g = torch.Generator().manual_seed(3)
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    rows = []
    for _ in range(6):
        perm = finite[torch.randperm(finite.numel(), generator=g)]
        rows.append(torch.cat([perm, perm.flip(0), perm[:RANK + ROPE - 2 * finite.numel()]]))
    cache = torch.stack([r.expand(64, -1) for r in rows]).contiguous().view(FP8).cuda()  # one page of 64 each
    table = torch.arange(6, dtype=torch.int32).view(6, 1).cuda()
    lens = torch.full((6,), 64, dtype=torch.int32).cuda()
    q = (torch.randn(6, heads, RANK + ROPE, generator=g) * 0.01).to(q_dtype).cuda()
    out, _ = decode("cuda", (q, cache, table, lens), kv_scale=KV_SCALE, num_kv_splits=1, out_dtype=torch.float32)
    want = numerics.fp8_cache_values(cache[:, 0, :RANK], KV_SCALE)[:, None].expand_as(out)
    assert torch.equal(out, want), f"{(out != want).sum().item()} values differ"
    assert kernels == ["wgmma"]


@pytest.mark.parametrize("heads", [16, 128])
def test_fp8_cache_unaligned_rows_and_graph(heads, kernels):
    """Rows that are not 16-byte aligned (a column slice of a 577-byte-wide cache: the producer's byte path) give
    the aligned cache's numbers bit for bit; int64 metadata; captured in a CUDA graph and replayed (16 heads: the
    keys-as-M kernel, 128: the 64-head one)."""
    q, cache, table, lens = _fp8_inputs((300, 17, 0, 64), heads, 16)
    sliced = _unaligned_rows(cache)
    aligned, aligned_lse = check((q, cache, table, lens), kv_scale=KV_SCALE, num_kv_splits=2)
    out, lse = check((q, sliced, table.long(), lens.long()), kv_scale=KV_SCALE, num_kv_splits=2)
    assert torch.equal(out, aligned) and torch.equal(lse, aligned_lse)
    kw = dict(softmax_scale=0.04, kv_lora_rank=RANK, qk_rope_head_dim=ROPE, num_kv_splits=4, kv_scale=KV_SCALE,
              backend="cuda")
    eager, _ = mla_core.mla_attention_decode(q, cache, table, lens, **kw)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mla_core.mla_attention_decode(q, cache, table, lens, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static, _ = mla_core.mla_attention_decode(q, cache, table, lens, **kw)
    static.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, eager)
    assert kernels == ["wgmma"] * 5


@pytest.mark.parametrize("heads", [1, 8, 16])
def test_fp8_cache_few_heads(heads, kernels):
    """The keys-as-M kernel (<= 16 heads, heads past the count padded): its two warpgroups take alternate 64-key
    steps and merge at the end, so odd and even step counts, one step, an empty split, a page of 48 (steps across
    pages) and 1-32 splits against the reference; fp16 q; bf16 output."""
    for q_dtype in (torch.bfloat16, torch.float16):
        inputs = _fp8_inputs((4097, 129, 64, 63, 0, 192, 700), heads, 48, q_dtype)
        for splits in (1, 5, 32):
            check(inputs, tol=1e-3, kv_scale=KV_SCALE, num_kv_splits=splits, out_dtype=torch.float32)
        out, _ = check(inputs, kv_scale=KV_SCALE, num_kv_splits=2)
        assert out.dtype == q_dtype
    assert kernels == ["wgmma"] * 8


# ------------------------------------------------------------------ keys-as-M on a bf16 / fp16 cache (<= 16 heads)


def _default_config_swapped(monkeypatch, kernel, launched):
    """Every cuda decode call from here on runs config {"kernel": kernel} in place of the default WGMMA one (same
    split choice, no autotune cache read); returns the list of the extension's launches, each named by
    ``launched(binding name, positional arguments)``."""
    from mla_core_cuda import decode as launcher
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")
    seen = []
    real = launcher.run

    class Module:
        def __init__(self, module):
            self._module = module

        def __getattr__(self, name):
            fn = getattr(self._module, name)

            def launch(*args, **kw):
                seen.append(launched(name, args))
                return fn(*args, **kw)
            return launch

    def run(module, call, config, prep=None):
        if config.get("kernel") == "wgmma":
            config = dict(config, kernel=kernel)
        return real(Module(module), call, config, prep)

    monkeypatch.setattr(launcher, "run", run)
    return seen


@pytest.fixture
def keys_m(monkeypatch):
    """The keys-as-M config ({"kernel": "keys_m"}, decode_km_kernel) in place of the default (see
    _default_config_swapped); the launches: "keys_m" for decode_wgmma with the keys_m flag."""
    return _default_config_swapped(monkeypatch, "keys_m", lambda name, args: "keys_m" if name == "decode_wgmma"
                                   and args[-1] is True else name)


@pytest.mark.parametrize("page_size", [1, 33, 64])
@pytest.mark.parametrize("heads", [1, 8, 16])
def test_keys_m(heads, page_size, keys_m):
    """The keys-as-M kernel against the reference: lengths on every 16-, 32- and 64-key edge (0, 1, +- 1: a
    producer warp's 16 rows, the P tiles, the steps its two warpgroups alternate), 1000, 32768; pages of 1, 33
    (steps across pages) and 64; 1, 3, 32 and auto splits; bf16 and float32 outputs; heads past the count padded."""
    inputs = _inputs(tuple(LENGTHS), heads, page_size)
    for splits in (1, 3, 32, "auto"):
        check(inputs, num_kv_splits=splits)
    check(inputs, tol=numerics.KEYS_AS_M_F32_RTOL[torch.bfloat16], num_kv_splits=5, out_dtype=torch.float32)
    assert keys_m == ["keys_m"] * 5


@pytest.mark.parametrize("heads", [1, 16])
def test_keys_m_fp16_and_odd_steps(heads, keys_m):
    """fp16 q and cache (P rounded to fp16); odd and even step counts, one step, an empty split, a page of 48."""
    for dtype in (torch.float16, torch.bfloat16):
        inputs = _inputs((4097, 129, 64, 63, 0, 192, 700), heads, 48, dtype)
        for splits in (1, 5, 32):
            check(inputs, tol=numerics.KEYS_AS_M_F32_RTOL[dtype], num_kv_splits=splits, out_dtype=torch.float32)
        out, _ = check(inputs, num_kv_splits=2)
        assert out.dtype == dtype
    assert keys_m == ["keys_m"] * 8


@pytest.mark.parametrize("heads", [8, 16])
def test_keys_m_agrees_with_wgmma(heads):
    """The keys-as-M config and the default WGMMA one (schedule Q1) compute the same function: float32 outputs
    within the sums' reordering and P's rounding against each warpgroup's own max (numerics.KEYS_AS_M_F32_RTOL;
    not bit-equal), LSE within 1e-4 (row sums from the float32 P)."""
    from mla_core.specs import validate_decode
    from mla_core_cuda import build, decode as launcher
    inputs = _inputs((1000, 63, 64, 65, 129, 0, 2049), heads, 16)
    problem, call = validate_decode(*inputs, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                                    qk_rope_head_dim=ROPE, page_size=None, num_kv_splits=4, k_qdq=None,
                                    k_qdq_amax=None, v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0,
                                    return_lse=True, out_dtype=torch.float32)
    assert launcher.configs(problem)[:2] == [launcher.WGMMA, launcher.KEYS_M]
    module = build.build()
    _poison_allocator()
    out, lse = launcher.run(module, call, launcher.KEYS_M)
    want, want_lse = launcher.run(module, call, launcher.WGMMA)
    lens = inputs[3]
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert (out[lens == 0] == 0).all() and (lse[lens == 0] == float("-inf")).all()
    assert rel_l2(out[lens > 0], want[lens > 0]) < numerics.KEYS_AS_M_F32_RTOL[torch.bfloat16]
    assert (lse[lens > 0] - want_lse[lens > 0]).abs().max().item() < 1e-4


def _metadata_unaligned_and_graph(monkeypatch, heads, last_len):
    """The body of the keys_m / ring4 tests below: absent and clamped keys against the reference, unaligned int64
    metadata bit-equal to the aligned call, a CUDA-graph replay (7 launches of the config under test)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    q, cache, table, lens = _inputs((100, 64, 40), heads, 16)
    cache = cache.nan_to_num(0.0)
    table = table.clone()
    table[0, 1] = 10 ** 9
    table[1, 0] = -5
    table[1, 1] = 10 ** 9
    capacity = table.shape[1] * 16
    long_lens = torch.tensor([2 ** 31 - 1, 64, 40], dtype=torch.int32, device="cuda")
    clamped = torch.tensor([capacity, 64, 40], dtype=torch.int32, device="cuda")
    out, lse = decode("cuda", (q, cache, table, long_lens), num_kv_splits=3)
    ref, ref_lse = decode("reference", (q, cache, table, clamped), num_kv_splits=3)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert rel_l2(out, ref) < 1e-2 and (lse - ref_lse).abs().max().item() < 1e-3
    q, cache, table, lens = _inputs((300, 17, 0, last_len), heads, 16)
    aligned, aligned_lse = check((q, cache, table, lens), num_kv_splits=2)
    out, lse = check((q, _unaligned_rows(cache), table.long(), lens.long()), num_kv_splits=2)
    assert torch.equal(out, aligned) and torch.equal(lse, aligned_lse)
    kw = dict(softmax_scale=0.04, kv_lora_rank=RANK, qk_rope_head_dim=ROPE, num_kv_splits=4, backend="cuda")
    _check_graph_replay(q, cache, table, lens, kw)


@pytest.mark.parametrize("heads", [16])
def test_keys_m_metadata_unaligned_and_graph(monkeypatch, heads, keys_m):
    """Table entries within a length that point outside the cache are absent keys (validity bits; request 1's
    first 32 keys all absent), a length past the table's capacity is clamped; rows that are not 16-byte aligned (a
    column slice of a 577-wide cache: the producer's 2-byte path) give the aligned cache's numbers bit for bit,
    int64 metadata; captured in a CUDA graph and replayed."""
    _metadata_unaligned_and_graph(monkeypatch, heads, 64)
    assert keys_m == ["keys_m"] * 7


# ------------------------------------------------- schedule Q1 on four 32-key ring slots ({"kernel": "ring4"})


RING_LENGTHS = boundary_lengths([16, 32, 64], extra=(1000, 4097))
"""test_ring4's lengths: LENGTHS with 4097 (odd steps over several splits) for 32768."""


@pytest.fixture
def ring4(monkeypatch):
    """The four-slot ring config ({"kernel": "ring4"}, decode_wgmma_ring4_kernel) in place of the default (see
    _default_config_swapped); the launches: "ring4" for decode_wgmma with its 21st positional argument, ``ring4``,
    True."""
    return _default_config_swapped(monkeypatch, "ring4", lambda name, args: "ring4" if name == "decode_wgmma"
                                   and len(args) == 21 and args[-1] is True else name)


@pytest.mark.parametrize("page_size", [33, 64])
@pytest.mark.parametrize("heads", [65, 128])
def test_ring4(heads, page_size, ring4):
    """The four-slot ring against the reference: lengths on every 16-, 32- and 64-key edge (0, 1, 63, 64, 65, ...:
    a producer warp pair's 32 rows, the P tiles, the steps), 1000, 4097 (32768 is the A/B's bit-equality rows, which
    keeps this test short enough for the device call); pages of 33 (steps across pages, the
    division-free lookup) and 64; 1, 3, 32 and auto splits; bf16 and float32 outputs; 65 heads: a full head group and
    a padded one (64 heads: test_ring4_bit_equal_to_wgmma). Outputs come from NaN-poisoned memory (an unwritten element
    fails)."""
    inputs = _inputs(tuple(RING_LENGTHS), heads, page_size)
    for splits in (1, 3, 32, "auto"):
        check(inputs, num_kv_splits=splits)
    check(inputs, num_kv_splits=5, out_dtype=torch.float32)
    assert ring4 == ["ring4"] * 5


def _same_bits(a, b):
    def bits(t):
        return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [64, 128])
def test_ring4_bit_equal_to_wgmma(heads, dtype):
    """The four-slot ring (ring4) runs schedule Q1's instructions in Q1's order (only the ring's barriers differ): out
    and LSE bit-equal to the default WGMMA config, bf16 / fp16, pages 16 and 64, 1 / 3 / 32 splits, float32
    and q-dtype outputs, lengths on the step edges; listed for the autotuner at these head counts."""
    from mla_core.specs import validate_decode
    from mla_core_cuda import build, decode as launcher
    module = build.build()
    for page_size in (16, 64):
        inputs = _inputs((0, 1, 63, 64, 65, 129, 1000, 4097), heads, page_size, dtype)
        for splits, out_dtype in ((1, None), (3, torch.float32), (32, None)):
            problem, call = validate_decode(*inputs, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                                            qk_rope_head_dim=ROPE, page_size=None, num_kv_splits=splits, k_qdq=None,
                                            k_qdq_amax=None, v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0,
                                            return_lse=True, out_dtype=out_dtype)
            assert launcher.configs(problem)[:2] == [launcher.WGMMA, launcher.RING4]
            _poison_allocator()
            want, want_lse = launcher.run(module, call, launcher.WGMMA)
            _poison_allocator()
            out, lse = launcher.run(module, call, launcher.RING4)
            assert not torch.isnan(out).any() and not torch.isnan(lse).any(), (page_size, splits)
            assert _same_bits(out, want) and _same_bits(lse, want_lse), (page_size, splits, rel_l2(out, want))


def test_ring4_metadata_unaligned_and_graph(monkeypatch, ring4):
    """128 heads: table entries within a length that point outside the cache are absent keys (request 1's first 32
    keys all absent), a length past the table's capacity is clamped; rows not 16-byte aligned (the producer's 2-byte
    path) give the aligned cache's numbers bit for bit, int64 metadata; captured in a CUDA graph and replayed."""
    _metadata_unaligned_and_graph(monkeypatch, 128, 65)
    assert ring4 == ["ring4"] * 7


# ------------------------------------------------------------------------------------------------------------------
# past the old cap of 32 splits (numerics.MAX_KV_SPLITS = 128, issue 9: batch 1 fills a 132-SM GPU)

MANY_SPLIT_LENGTHS = (0, 1, 33, 4096, 8191, 32768)
"""Ragged lengths for 64 / 128 splits: empty, one key, fewer tiles than splits (empty splits), a 32-key tile per split
at 128 (4096), one short of a tile edge, and 32768 (8 tiles per split at 128)."""


@pytest.mark.parametrize("splits", [64, 128])
@pytest.mark.parametrize("heads", [16, 128])
def test_many_splits(heads, splits, kernels):
    """64 and 128 splits against the reference: batch 1 at 8192 and 32768 keys, page 64, then the ragged lengths,
    unquantized and the fp8 recipe (P quantized: the split schedule shows) on the WGMMA kernel, then the nvfp4
    recipe on the mma.sync kernel (its grid and the shared combine at the same count)."""
    for length in (8192, 32768):
        check(_inputs((length,), heads, 64), num_kv_splits=splits)
    ragged = _inputs(MANY_SPLIT_LENGTHS, heads, 64)
    check(ragged, num_kv_splits=splits)
    check(ragged, quantized=True, k_qdq="fp8", v_qdq="fp8", p_qdq="fp8", num_kv_splits=splits)
    assert kernels == ["wgmma"] * 4
    check(ragged, quantized=True, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4", num_kv_splits=splits)
    assert kernels[-1] == "mma.sync"


@pytest.mark.parametrize("splits", [4, 5, 16, 17])
@pytest.mark.parametrize("heads", [16, 128])
def test_combine_row_batch_edges(heads, splits, kernels):
    """The combine's two instances at their edges (csrc/mla_decode.cu: 4 partial rows a batch up to 4 splits, 16
    above): 4 and 5 splits (the switch), 16 and 17 (one full batch, then a second with one row present), over the
    split schedule's edge lengths for that count (mla_core.testing.shapes: splits full, one key past, one left
    empty); unquantized and the fp8 recipe on the WGMMA kernel, the nvfp4 recipe on mma.sync (the same combine)."""
    ragged = _inputs(tuple(split_boundary_lengths(splits)), heads, 64)
    check(ragged, num_kv_splits=splits)
    check(ragged, quantized=True, k_qdq="fp8", v_qdq="fp8", p_qdq="fp8", num_kv_splits=splits)
    assert kernels == ["wgmma"] * 2
    check(ragged, quantized=True, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4", num_kv_splits=splits)
    assert kernels[-1] == "mma.sync"


@pytest.mark.parametrize("splits", [64, 128])
def test_keys_m_many_splits(splits, keys_m):
    """The keys-as-M kernel (16 heads) at 64 / 128 splits: batch 1 at 32768 keys and the ragged lengths."""
    check(_inputs((32768,), 16, 64), num_kv_splits=splits)
    check(_inputs(MANY_SPLIT_LENGTHS, 16, 64), num_kv_splits=splits)
    assert keys_m == ["keys_m"] * 2


@pytest.mark.parametrize("heads", [16, 128])
def test_fp8_cache_many_splits(heads, kernels):
    """An FP8 cache (the keys-as-M kernel at 16 heads, the 64-head WGMMA one at 128) at 128 splits."""
    inputs = _fp8_inputs(MANY_SPLIT_LENGTHS, heads, 64)
    check(inputs, tol=1e-3, kv_scale=KV_SCALE, num_kv_splits=128, out_dtype=torch.float32)


@pytest.mark.parametrize("heads", [16, 128])
def test_auto_fills_the_gpu_at_batch_1(heads, kernels):
    """"auto" at batch 1 over 32768 keys, no tuned entry: the WGMMA kernel runs one CTA per SM per 64-head group and
    split, now up to 128 splits (32 before): sm_count // head groups (H200: 128 at 16 heads, 66 at 128); against the
    reference."""
    from mla_core.specs import sm_count, validate_decode
    from mla_core_cuda import decode as launcher
    inputs = _inputs((32768,), heads, 64)
    _, call = validate_decode(*inputs, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                              page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None, v_qdq=None,
                              v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    groups = -(-heads // 64)
    tiles = -(-inputs[2].shape[1] * 64 // 32)
    want = min(numerics.MAX_KV_SPLITS, sm_count(inputs[0].device) // groups, -(-tiles // (4 * groups)))
    assert launcher.num_splits(call, launcher.WGMMA) == want > 32
    check(inputs, num_kv_splits="auto")
    assert kernels == ["wgmma"]
