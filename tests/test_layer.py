"""mla_core.mla_forward (the fused layer) on the reference backend against independent float64 math.

The float64 math below is a naive per-token loop written from docs/layer.md: for each token it normalizes and
rotates its request's new latent rows (rotation by complex multiplication), reads the prefix rows from the cache
as they were before the call, up-projects every key with w_k / w_uv (never the absorbed form), and takes a
softmax over the visible keys with the sink in the denominator. Weights enter as their exact float64 value
(FP8 code x block scale, computed here).
"""
from __future__ import annotations

import math

import pytest
import torch

import mla_core
from mla_core import MLAInputError
from mla_core.testing.shapes import boundary_lengths
from reference_math import rel_l2

FP8 = torch.float8_e4m3fn
HEADS, NOPE, ROPE, LATENT, V_DIM = 4, 16, 8, 32, 16
BLOCK = (8, 16)
PAGE = 4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These ops are tiny: one intra-op thread avoids oversubscribing a shared CI machine (10x faster here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------------
# inputs


def quantize_blocks(w: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 codes of float ``w`` [..., R, C] with one float32 scale ``amax / 448`` per rows x cols block."""
    *lead, r, c = w.shape
    pr, pc = -(-r // rows) * rows, -(-c // cols) * cols
    padded = torch.nn.functional.pad(w.float(), (0, pc - c, 0, pr - r))
    blocks = padded.reshape(*lead, pr // rows, rows, pc // cols, cols)
    scale = blocks.abs().amax(dim=(-3, -1)) / 448.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = (blocks / scale[..., :, None, :, None]).to(FP8).reshape(*lead, pr, pc)[..., :r, :c]
    return codes.contiguous(), scale.float()


def dequant64(codes: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """float64 value of block-scaled codes [..., R, C] (scale [..., ceil(R/rows), ceil(C/cols)])."""
    r, c = codes.shape[-2:]
    s = scale.double().repeat_interleave(rows, -2)[..., :r, :].repeat_interleave(cols, -1)[..., :c]
    return codes.double() * s


def uk_scale_from_k(k_scale: torch.Tensor, heads: int, nope: int, latent: int, block) -> torch.Tensor:
    """w_uk's scales [heads, ceil(latent / b1), ceil(nope / b0)] read from w_k's at each w_uk block's first element."""
    rows = torch.arange(heads)[:, None] * nope + torch.arange(0, nope, block[0])[None, :]     # [H, nope blocks]
    cols = torch.arange(0, latent, block[1])                                                  # [latent blocks]
    return k_scale[rows[:, None, :] // block[0], cols[None, :, None] // block[1]].contiguous()


class Weights:
    """w_k / w_uk / w_uv with the absorbed w_uk the per-head transpose of w_k; float64 values for the math."""

    def __init__(self, gen, fp8: bool, dtype: torch.dtype, heads=HEADS, nope=NOPE, latent=LATENT, v_dim=V_DIM,
                 block=BLOCK):
        w_k = torch.randn(heads * nope, latent, generator=gen) / math.sqrt(latent)
        w_uv = torch.randn(heads, v_dim, latent, generator=gen) / math.sqrt(latent)
        self.block = block
        self.unquantized_k, self.unquantized_uv = w_k.double(), w_uv.double()
        if fp8:
            k_codes, k_scale = quantize_blocks(w_k, *block)
            uv_codes, uv_scale = quantize_blocks(w_uv, *block)
            self.w_k, self.w_k_scale = k_codes, k_scale
            self.w_uk = k_codes.view(heads, nope, latent).transpose(1, 2).contiguous()
            self.w_uk_scale = uk_scale_from_k(k_scale, heads, nope, latent, block)
            self.w_uv, self.w_uv_scale = uv_codes, uv_scale
            self.k64 = dequant64(k_codes, k_scale, *block)
            self.uv64 = dequant64(uv_codes, uv_scale, *block)
        else:
            self.w_k, self.w_uv = w_k.to(dtype), w_uv.to(dtype)
            self.w_uk = self.w_k.view(heads, nope, latent).transpose(1, 2).contiguous()
            self.w_k_scale = self.w_uk_scale = self.w_uv_scale = None
            self.k64, self.uv64 = self.w_k.double(), self.w_uv.double()

    def kwargs(self) -> dict:
        return dict(w_k=self.w_k, w_uk=self.w_uk, w_uv=self.w_uv, w_k_scale=self.w_k_scale,
                    w_uk_scale=self.w_uk_scale, w_uv_scale=self.w_uv_scale, weight_block_size=self.block)


def make_case(lens, starts, *, dtype=torch.float32, fp8=False, sinks=False, seed=0, page=PAGE, extra_pages=3,
              heads=HEADS, nope=NOPE, rope=ROPE, latent=LATENT, v_dim=V_DIM, block=BLOCK):
    """Random layer inputs: prefix rows already in a NaN-poisoned paged cache, pages shuffled, spare pages."""
    gen = torch.Generator().manual_seed(seed)
    batch, tokens = len(lens), sum(lens)
    ends = [s + n for s, n in zip(starts, lens)]
    pages_per = [-(-e // page) for e in ends]
    width = max(pages_per + [1]) + 1
    num_pages = sum(pages_per) + extra_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.full((batch, width), -1, dtype=torch.int32)        # entries past a request's pages: never read
    nxt = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = torch.tensor(perm[nxt:nxt + n], dtype=torch.int32)
        nxt += n
    cache = torch.full((num_pages, page, latent + rope), float("nan"), dtype=dtype)
    for b, s in enumerate(starts):
        for p in range(s):
            cache[table[b, p // page], p % page] = torch.randn(latent + rope, generator=gen).to(dtype)
    max_pos = max(ends + [1]) + 5
    angles = torch.rand(max_pos, rope // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    mscale = 1.0 + 0.2 * torch.rand((), generator=gen).item()    # a YaRN-style magnitude folded into the table
    freqs = torch.stack((angles.cos() * mscale, angles.sin() * mscale), dim=-1).flatten(-2).float()
    case = dict(
        q=torch.randn(tokens, heads, nope + rope, generator=gen).to(dtype),
        kv=(torch.randn(tokens, latent + rope, generator=gen) * 3).to(dtype),
        input_row_offsets=torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
        if lens else torch.zeros(1, dtype=torch.int32),
        freqs_cis=freqs, kv_norm_gamma=(1 + 0.5 * torch.randn(latent, generator=gen)).to(dtype),
        latent_cache=cache, block_table=table, cache_offsets=torch.tensor(starts, dtype=torch.int64),
        max_seq_len=max(lens + [0]), softmax_scale=(nope + rope) ** -0.5, epsilon=1e-5,
        attn_sinks=torch.randn(heads, generator=gen) if sinks else None)
    weights = Weights(gen, fp8, dtype, heads, nope, latent, v_dim, block)
    return case, weights


def run(case, weights, **over):
    """mla_forward on a copy of the case's cache, the layer and its attention on the reference backend unless
    ``over`` says (``backend`` for the layer, ``attention_backend`` for the attention)."""
    args = {"attention_backend": "reference", "backend": "reference", **case, **weights.kwargs(), **over}
    cache = args.pop("latent_cache").clone()
    pos = [args.pop(k) for k in ("q", "kv", "input_row_offsets", "freqs_cis", "kv_norm_gamma")]
    out = mla_core.mla_forward(*pos, cache, args.pop("block_table"), args.pop("cache_offsets"), **args)
    return out, cache


# --------------------------------------------------------------------------------------------------
# independent float64 math


def rope64(x: torch.Tensor, freqs_row: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate float64 x [..., rope] by the complex numbers cos + i sin of a freqs_cis row."""
    rot = torch.complex(freqs_row[0::2].double(), freqs_row[1::2].double())
    half = x.shape[-1] // 2
    if interleave:
        z = torch.complex(x[..., 0::2], x[..., 1::2]) * rot
        return torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    z = torch.complex(x[..., :half], x[..., half:]) * rot
    return torch.cat((z.real, z.imag), dim=-1)


def layer_math(case, weights, interleave=True):
    """Expected (out [tokens, heads, v] float64, {(page, slot): new cache row float64 rounded to the cache dtype})."""
    q, kv, cache = case["q"].double(), case["kv"].double(), case["latent_cache"]
    table, freqs = case["block_table"], case["freqs_cis"]
    offsets, starts = case["input_row_offsets"].tolist(), case["cache_offsets"].tolist()
    heads, v_dim = q.shape[1], weights.uv64.shape[1]
    latent = case["kv_norm_gamma"].shape[0]
    nope = q.shape[2] - freqs.shape[1]
    page = cache.shape[1]
    w_k = weights.k64.view(heads, nope, latent)
    out = torch.zeros(q.shape[0], heads, v_dim, dtype=torch.float64)
    written = {}
    for b in range(len(starts)):
        start, t0, t1 = starts[b], offsets[b], offsets[b + 1]
        rows = [cache[table[b, p // page], p % page].double() for p in range(start)]
        for t in range(t0, t1):
            pos = start + t - t0
            lat = kv[t, :latent]
            lat = lat / torch.sqrt((lat * lat).mean() + case["epsilon"]) * case["kv_norm_gamma"].double()
            row = torch.cat((lat, rope64(kv[t, latent:], freqs[pos], interleave)))
            row = row.to(cache.dtype).double()                       # the cache holds it in its dtype
            written[(int(table[b, pos // page]), pos % page)] = row
            rows.append(row)
        keys = torch.stack(rows) if rows else None
        for t in range(t0, t1):
            pos = start + t - t0
            visible = keys[:pos + 1]
            for h in range(heads):
                q_rope = rope64(q[t, h, nope:], freqs[pos], interleave)
                k_nope = visible[:, :latent] @ w_k[h].T
                scores = (k_nope @ q[t, h, :nope] + visible[:, latent:] @ q_rope) * case["softmax_scale"]
                top = scores.max()
                p = torch.exp(scores - top)
                denom = p.sum()
                if case["attn_sinks"] is not None:
                    denom = denom + math.exp(float(case["attn_sinks"][h]) - top)
                values = visible[:, :latent] @ weights.uv64[h].T
                out[t, h] = (p / denom) @ values
    return out, written


# --------------------------------------------------------------------------------------------------
# numerics


def tolerance(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


PREFILL_SHAPES = [  # (lens, cache_offsets): empty requests, page edges (page 4), long prefixes, all new
    ([3, 0, 5, 1], [0, 2, 7, 4]),
    ([4, 8, 1], [4, 0, 11]),
    ([9], [0]),
]


@pytest.mark.parametrize("lens,starts", PREFILL_SHAPES)
@pytest.mark.parametrize("dtype,fp8,sinks,interleave", [
    (torch.float32, False, False, True), (torch.float32, True, True, True), (torch.float32, False, True, False),
    (torch.bfloat16, False, False, True), (torch.bfloat16, True, True, False)])
def test_prefill_matches_float64(lens, starts, dtype, fp8, sinks, interleave):
    case, weights = make_case(lens, starts, dtype=dtype, fp8=fp8, sinks=sinks)
    out, cache = run(case, weights, rope_interleave=interleave)
    ref, written = layer_math(case, weights, interleave)
    assert out.dtype == dtype and out.shape == (sum(lens), HEADS, V_DIM) and out.is_contiguous()
    assert rel_l2(out, ref) < tolerance(dtype)
    _check_cache(case, cache, written, dtype)


DECODE_STARTS = boundary_lengths([PAGE, 32], limit=70)    # cached tokens before the new one: page and P-tile edges


@pytest.mark.parametrize("dtype,fp8,sinks", [(torch.float32, False, False), (torch.float32, True, True),
                                             (torch.bfloat16, True, False), (torch.bfloat16, False, True)])
def test_decode_matches_float64(dtype, fp8, sinks):
    starts = DECODE_STARTS
    lens = [1] * len(starts)
    lens[2] = 0                                              # a request with no token this step
    case, weights = make_case(lens, starts, dtype=dtype, fp8=fp8, sinks=sinks, seed=1)
    assert case["max_seq_len"] == 1
    out, cache = run(case, weights)
    assert out.is_contiguous()                               # as the fake kernel promises torch.compile
    ref, written = layer_math(case, weights)
    assert rel_l2(out, ref) < tolerance(dtype)
    _check_cache(case, cache, written, dtype)


def _check_cache(case, cache, written, dtype):
    """New rows where the math put them (bitwise in fp32 up to RMSNorm rounding); every other slot untouched."""
    before = case["latent_cache"]
    touched = torch.zeros(cache.shape[:2], dtype=torch.bool)
    for (page, slot), row in written.items():
        touched[page, slot] = True
        assert rel_l2(cache[page, slot], row) < (1e-6 if dtype == torch.float32 else 8e-3)
    assert torch.equal(cache[~touched].isnan(), before[~touched].isnan())
    same = ~before[~touched].isnan()
    assert torch.equal(cache[~touched][same], before[~touched][same])


def test_decode_equals_prefill_of_one_token():
    """max_seq_len picks the path only: the absorbed decode and the up-projected prefill agree (fp32)."""
    case, weights = make_case([1, 1, 1], [0, 5, 40], fp8=True, sinks=True, seed=2)
    decode, cache_d = run(case, weights)
    prefill, cache_p = run(case, weights, max_seq_len=2)
    assert rel_l2(decode, prefill) < 1e-5
    assert torch.equal(cache_d.nan_to_num(7.0), cache_p.nan_to_num(7.0))


@pytest.mark.parametrize("lens,max_seq_len,path", [([1, 0, 1], 1, "decode"), ([1, 0, 1], 2, "prefill"),
                                                     ([2, 1], 2, "prefill")])
def test_max_seq_len_picks_the_path(monkeypatch, lens, max_seq_len, path):
    """1 runs the absorbed decode over the latent cache, more runs prefill over up-projected K / V."""
    calls = []
    for name in ("mla_decode", "mla_prefill"):
        real = getattr(mla_core, name)
        monkeypatch.setattr(mla_core, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    case, weights = make_case(lens, [4, 0, 9][:len(lens)], seed=16)
    out, _ = run(case, weights, max_seq_len=max_seq_len)
    assert calls == ["mla_" + path]
    assert rel_l2(out, layer_math(case, weights)[0]) < 1e-5


def test_fp8_weights_are_quantized():
    """FP8 codes x block scales are what runs: close to the quantized math, measurably far from the float weights."""
    case, weights = make_case([5, 3], [2, 9], fp8=True, seed=3)
    out, _ = run(case, weights)
    ref, _ = layer_math(case, weights)
    weights.k64, weights.uv64 = weights.unquantized_k, weights.unquantized_uv
    unquantized, _ = layer_math(case, weights)
    assert rel_l2(out, ref) < 1e-5
    assert rel_l2(out, unquantized) > 1e-3


def test_block_index_uses_each_blocks_own_scale():
    """Scales that differ per block by powers of two: a wrong block index changes the output."""
    case, weights = make_case([4], [3], fp8=True, seed=4)
    for name in ("w_k_scale", "w_uk_scale", "w_uv_scale"):
        s = getattr(weights, name)
        setattr(weights, name, s * 2.0 ** torch.arange(s.numel()).view(s.shape).remainder(5))
    weights.w_uk_scale = uk_scale_from_k(weights.w_k_scale, HEADS, NOPE, LATENT, BLOCK)
    weights.k64 = dequant64(weights.w_k, weights.w_k_scale, *BLOCK)
    weights.uv64 = dequant64(weights.w_uv, weights.w_uv_scale, *BLOCK)
    ref, _ = layer_math(case, weights)
    assert rel_l2(run(case, weights)[0], ref) < 1e-5
    dec_case, dec_w = make_case([1, 1], [7, 20], fp8=True, seed=5)
    dec_w.w_k_scale = dec_w.w_k_scale * 2.0 ** torch.arange(dec_w.w_k_scale.numel()).view(dec_w.w_k_scale.shape).remainder(3)
    dec_w.w_uk_scale = uk_scale_from_k(dec_w.w_k_scale, HEADS, NOPE, LATENT, BLOCK)
    dec_w.k64 = dequant64(dec_w.w_k, dec_w.w_k_scale, *BLOCK)
    assert rel_l2(run(dec_case, dec_w)[0], layer_math(dec_case, dec_w)[0]) < 1e-5


def test_default_block_partial_blocks():
    """128 x 128 blocks larger than the weights (one partial block per matrix)."""
    case, weights = make_case([3, 1], [0, 6], fp8=True, seed=6, block=(128, 128))
    assert weights.w_k_scale.shape == (1, 1) and weights.w_uk_scale.shape == (HEADS, 1, 1)
    assert rel_l2(run(case, weights)[0], layer_math(case, weights)[0]) < 1e-5


def test_epsilon_matters():
    """A small latent row makes epsilon visible: the op uses the given epsilon."""
    case, weights = make_case([2], [1], seed=7)
    case["kv"][:, :LATENT] *= 1e-3
    case["epsilon"] = 1e-4
    out, _ = run(case, weights)
    assert rel_l2(out, layer_math(case, weights)[0]) < 1e-5
    case_other = dict(case, epsilon=1e-6)
    assert rel_l2(out, layer_math(case_other, weights)[0]) > 1e-3


def test_sequential_steps_follow_the_cache():
    """Prefill then decode steps through one cache equal the float64 math of the whole history."""
    lens0, starts0 = [5, 2], [0, 0]
    case, weights = make_case(lens0, starts0, seed=8, extra_pages=4)
    # Give each request room for 3 more tokens (page 4: request 0 needs pages for 8 tokens, request 1 for 5).
    cache = case["latent_cache"].clone()
    out0 = mla_core.mla_forward(case["q"], case["kv"], case["input_row_offsets"], case["freqs_cis"],
                                case["kv_norm_gamma"], cache, case["block_table"], case["cache_offsets"],
                                max_seq_len=5, softmax_scale=case["softmax_scale"], epsilon=case["epsilon"],
                                attention_backend="reference", **weights.kwargs())
    gen = torch.Generator().manual_seed(9)
    table = case["block_table"].clone()
    spare = sorted(set(range(cache.shape[0])) - set(table[table >= 0].tolist()))
    table[0, 2], table[1, 1] = spare[0], spare[1]
    lengths = torch.tensor([5, 2])
    qs, kvs, outs = [case["q"]], [case["kv"]], [out0]
    for _ in range(3):
        q = torch.randn(2, HEADS, NOPE + ROPE, generator=gen)
        kv = torch.randn(2, LATENT + ROPE, generator=gen)
        outs.append(mla_core.mla_forward(q, kv, torch.tensor([0, 1, 2]), case["freqs_cis"], case["kv_norm_gamma"],
                                         cache, table, lengths, max_seq_len=1, softmax_scale=case["softmax_scale"],
                                         epsilon=case["epsilon"], attention_backend="reference",
                                         **weights.kwargs()))
        qs.append(q)
        kvs.append(kv)
        lengths = lengths + 1
    # The same history as one prefill of each whole request from an empty cache.
    order = [[(0, i) for i in range(5)] + [(k, 0) for k in range(1, 4)],
             [(0, 5 + i) for i in range(2)] + [(k, 1) for k in range(1, 4)]]
    whole = dict(case, q=torch.stack([qs[k][i] for req in order for k, i in req]),
                 kv=torch.stack([kvs[k][i] for req in order for k, i in req]),
                 input_row_offsets=torch.tensor([0, 8, 13], dtype=torch.int32), block_table=table,
                 cache_offsets=torch.tensor([0, 0]), max_seq_len=8)
    ref, _ = layer_math(whole, weights)
    got = torch.stack([outs[k][i] for req in order for k, i in req])
    assert rel_l2(got, ref) < 1e-5


def test_attention_on_any_backend():
    """Automatic dispatch of the inner attention (the Triton interpreter on a CPU CI machine) agrees."""
    for lens, starts in (([2, 3], [5, 0]), ([1, 1, 0], [3, 33, 1])):
        case, weights = make_case(lens, starts, fp8=True, sinks=True, seed=15)
        ref, ref_cache = run(case, weights)
        out, cache = run(case, weights, attention_backend=None)
        assert rel_l2(out, ref) < 1e-5
        assert torch.equal(cache.nan_to_num(1.0), ref_cache.nan_to_num(1.0))


def sparse_math(case, weights, indices, lengths):
    """Expected output when each token attends to its selected cache rows (float64, after the new rows are written)."""
    _, written = layer_math(case, weights)
    cache = case["latent_cache"].double().clone()
    page = cache.shape[1]
    for (p, slot), row in written.items():
        cache[p, slot] = row
    flat = cache.view(-1, cache.shape[-1])
    q, freqs = case["q"].double(), case["freqs_cis"]
    heads, latent = q.shape[1], case["kv_norm_gamma"].shape[0]
    nope = q.shape[2] - freqs.shape[1]
    w_k = weights.k64.view(heads, nope, latent)
    offsets, starts = case["input_row_offsets"].tolist(), case["cache_offsets"].tolist()
    out = torch.zeros(q.shape[0], heads, weights.uv64.shape[1], dtype=torch.float64)
    for b in range(len(starts)):
        for t in range(offsets[b], offsets[b + 1]):
            pos = starts[b] + t - offsets[b]
            slots = [int(i) for i in indices[t, :int(lengths[t])] if 0 <= int(i) < flat.shape[0]]
            if not slots:
                continue
            keys = flat[slots]
            for h in range(heads):
                q_rope = rope64(q[t, h, nope:], freqs[pos], True)
                scores = (keys[:, :latent] @ w_k[h].T @ q[t, h, :nope] + keys[:, latent:] @ q_rope) * case["softmax_scale"]
                top = scores.max()
                p_ = torch.exp(scores - top)
                denom = p_.sum() + (math.exp(float(case["attn_sinks"][h]) - top) if case["attn_sinks"] is not None else 0)
                out[t, h] = (p_ / denom) @ (keys[:, :latent] @ weights.uv64[h].T)
    return out


@pytest.mark.parametrize("lens,starts,dtype,fp8", [([3, 1, 0, 2], [5, 9, 2, 30], torch.float32, True),
                                                   ([1, 1], [40, 3], torch.bfloat16, False)])
def test_sparse_indices_match_float64(monkeypatch, lens, starts, dtype, fp8):
    """DeepSeek-V3.2 top-k rows per token: -1, rows outside the cache and slots past topk_lengths are not keys;
    a token with no valid slot gives 0; duplicates count twice; prefill and decode calls take the same path."""
    case, weights = make_case(lens, starts, dtype=dtype, fp8=fp8, sinks=True, seed=18)
    gen = torch.Generator().manual_seed(19)
    table, page = case["block_table"], case["latent_cache"].shape[1]
    offsets, top_k = case["input_row_offsets"].tolist(), 8
    rows = case["latent_cache"].shape[0] * page
    indices = torch.zeros((sum(lens), top_k), dtype=torch.int32)   # past the lengths: row 0 (may be NaN), never read
    lengths = torch.zeros(sum(lens), dtype=torch.int32)
    for b in range(len(lens)):
        for t in range(offsets[b], offsets[b + 1]):
            pos = starts[b] + t - offsets[b]
            picks = torch.randint(0, pos + 1, (6,), generator=gen).tolist() + [pos]
            phys = [int(table[b, p // page]) * page + p % page for p in picks]
            phys[1] = -1
            phys[2] = rows + 5                                                 # outside the cache: not a key
            n = int(torch.randint(3, 8, (), generator=gen))
            indices[t, :n] = torch.tensor(phys[:n], dtype=torch.int32)
            lengths[t] = n
    lengths[0] = 0 if len(lens) > 2 else lengths[0]
    with pytest.raises(MLAInputError, match="sparse_indices"):                 # content checks refuse rows + 5
        run(case, weights, sparse_indices=indices, topk_lengths=lengths)
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    out, _ = run(case, weights, sparse_indices=indices, topk_lengths=lengths)
    monkeypatch.delenv("MLA_CORE_CHECKS")
    ref = sparse_math(case, weights, indices, lengths)
    assert rel_l2(out, ref) < tolerance(dtype)
    if len(lens) > 2:
        assert torch.equal(out[0], torch.zeros_like(out[0]))
    indices[indices == rows + 5] = -1                                          # valid for the content checks
    out_checked, _ = run(case, weights, sparse_indices=indices, topk_lengths=lengths)
    assert rel_l2(out_checked, sparse_math(case, weights, indices, lengths)) < tolerance(dtype)


def test_sparse_arguments():
    case, weights = make_case([2, 1], [1, 3], seed=20)
    idx = torch.zeros(3, 4, dtype=torch.int32)
    for name, over in (("sparse_indices", dict(sparse_indices=idx[:2])),
                       ("sparse_indices", dict(sparse_indices=idx.float())),
                       ("sparse_indices", dict(sparse_indices=idx - 2)),
                       ("topk_lengths", dict(sparse_indices=idx, topk_lengths=torch.tensor([1, 5, 0]))),
                       ("topk_lengths", dict(topk_lengths=torch.tensor([1, 1, 1])))):
        with pytest.raises(MLAInputError, match=name):
            run(case, weights, **over)


@pytest.mark.parametrize("lens,starts,bad", [([2], [0], [(0, 0)]), ([3, 2, 1], [0, 4, 2], [(1, 1), (0, 0)]),
                                             ([1, 1], [0, 9], [(0, 0)])])
def test_out_of_table_writes_are_dropped_without_checks(monkeypatch, lens, starts, bad):
    """MLA_CORE_CHECKS=metadata: rows on a page outside the cache are not written (others are) and not read."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case, weights = make_case(lens, starts, seed=10, extra_pages=0)
    for b, col in bad:
        case["block_table"][b, col] = 10_000
    out, cache = run(case, weights)
    _, written = layer_math(case, weights)
    before = case["latent_cache"]
    for (page, slot), row in written.items():
        if page < cache.shape[0]:
            assert rel_l2(cache[page, slot], row) < 1e-6
            before = before.clone()
            before[page, slot] = cache[page, slot]
    assert torch.equal(cache.nan_to_num(5.0), before.nan_to_num(5.0))      # nothing else changed
    assert not out.isnan().any()


@pytest.mark.parametrize("sparse", [False, True])
def test_decode_path_has_no_host_sync(monkeypatch, sparse):
    """The reference decode step under FakeTensorMode (a value read, .item(), nonzero or a boolean mask would raise):
    the CPU stand-in for 'a decode step can be captured in a CUDA graph'. The attention op is stubbed."""
    import dataclasses

    from torch._subclasses.fake_tensor import FakeTensorMode

    from mla_core import layer
    from mla_core_reference.layer import mla_forward_reference
    case, weights = make_case([1, 0, 1, 1], [3, 9, 0, 40], fp8=True, sinks=True, seed=17)
    _, call = layer.validate_layer(
        case["q"], case["kv"], case["input_row_offsets"], case["freqs_cis"], case["kv_norm_gamma"],
        case["latent_cache"], case["block_table"], case["cache_offsets"], max_seq_len=1,
        softmax_scale=case["softmax_scale"], epsilon=case["epsilon"], attn_sinks=case["attn_sinks"], rope_interleave=True,
        attention_backend=None, sparse_indices=torch.tensor([[0, -1], [3, 2], [1, 1]]) if sparse else None,
        topk_lengths=torch.tensor([2, 1, 0]) if sparse else None, **weights.kwargs())
    monkeypatch.setattr(mla_core, "mla_decode", lambda q, *a, **k: (q.new_empty(*q.shape[:2], LATENT),
                                                                     q.new_empty(q.shape[:2], dtype=torch.float32)))
    with FakeTensorMode() as mode:
        fake = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in fake.items()}
        out = mla_forward_reference(layer.LayerCall(**fake))
    assert out.shape == (3, HEADS, V_DIM)


def test_no_tokens():
    case, weights = make_case([0, 0], [3, 0], seed=11)
    out, cache = run(case, weights)
    assert out.shape == (0, HEADS, V_DIM)


# --------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("name,make", [
    ("q", lambda c, w: dict(q=c["q"][:, :, :-1])),
    ("q", lambda c, w: dict(q=c["q"].half())),
    ("kv", lambda c, w: dict(kv=c["kv"][:-1])),
    ("freqs_cis", lambda c, w: dict(freqs_cis=c["freqs_cis"][:, :7])),
    ("freqs_cis", lambda c, w: dict(freqs_cis=c["freqs_cis"][:3])),
    ("kv_norm_gamma", lambda c, w: dict(kv_norm_gamma=c["kv_norm_gamma"][:-2])),
    ("latent_cache", lambda c, w: dict(latent_cache=c["latent_cache"].transpose(0, 1))),
    ("input_row_offsets", lambda c, w: dict(input_row_offsets=torch.tensor([0, 2, 4], dtype=torch.int32))),
    ("input_row_offsets", lambda c, w: dict(input_row_offsets=torch.tensor([1, 2, 3], dtype=torch.int32))),
    ("input_row_offsets", lambda c, w: dict(input_row_offsets=c["input_row_offsets"].float())),
    ("block_table", lambda c, w: dict(block_table=c["block_table"][:1])),
    ("block_table", lambda c, w: dict(block_table=c["block_table"].clone().fill_(99))),
    ("cache_offsets", lambda c, w: dict(cache_offsets=torch.tensor([1, -1]))),
    ("cache_offsets", lambda c, w: dict(cache_offsets=torch.tensor([1, 100]))),
    ("cache_offsets", lambda c, w: dict(cache_offsets=torch.tensor([1]))),
    ("max_seq_len", lambda c, w: dict(max_seq_len=1)),
    ("max_seq_len", lambda c, w: dict(max_seq_len=-1)),
    ("w_k", lambda c, w: dict(w_k=w.w_k[:, :-1])),
    ("w_uk", lambda c, w: dict(w_uk=w.w_uk.transpose(1, 2))),
    ("w_uv", lambda c, w: dict(w_uv=w.w_uv[:, :, :-1])),
    ("w_k_scale", lambda c, w: dict(w_k_scale=torch.ones(1, 1))),
    ("softmax_scale", lambda c, w: dict(softmax_scale=0.0)),
    ("epsilon", lambda c, w: dict(epsilon=float("nan"))),
    ("attn_sinks", lambda c, w: dict(attn_sinks=torch.zeros(HEADS + 1))),
    ("rope_interleave", lambda c, w: dict(rope_interleave=1)),
    ("weight_block_size", lambda c, w: dict(weight_block_size=(0, 128))),
    ("kv_norm_gamma", lambda c, w: dict(kv_norm_gamma=c["kv_norm_gamma"].to("meta"))),
    ("w_uv", lambda c, w: dict(w_uv=w.w_uv.to("meta"))),
])
def test_bad_arguments(name, make):
    case, weights = make_case([2, 1], [1, 3], seed=12)
    with pytest.raises(MLAInputError, match=name):
        run(case, weights, **make(case, weights))


# --------------------------------------------------------------------------------------------------
# metadata checks once per key (eager calls)


@pytest.fixture
def counted_validation(monkeypatch):
    """A fresh memo of metadata-checked calls; returns the list of _validate_metadata calls."""
    from mla_core import layer
    monkeypatch.setattr(layer, "_VALIDATED", {})
    seen = []
    real = layer._validate_metadata

    def counting(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(layer, "_validate_metadata", counting)
    return seen


def test_metadata_checks_run_once_per_key(counted_validation):
    """Equal metadata reuses the checked call (results as with a fresh check); every other key checks again."""
    case, weights = make_case([1, 1], [3, 6], fp8=True, seed=21)
    other, other_w = make_case([1, 1], [3, 6], fp8=True, seed=22)       # same shapes, other values
    first, _ = run(case, weights)
    second, cache2 = run(other, other_w)
    assert len(counted_validation) == 1
    fresh, fresh_cache = run(other, other_w, softmax_scale=float(other["softmax_scale"]) * 1.0)  # same key
    assert len(counted_validation) == 1
    assert torch.equal(second, fresh) and torch.equal(cache2.nan_to_num(7.0), fresh_cache.nan_to_num(7.0))
    assert not torch.equal(first, second)
    changes = [dict(softmax_scale=0.3), dict(epsilon=1e-4), dict(rope_interleave=False), dict(max_seq_len=2),
               dict(weight_block_size=list(BLOCK)), dict(attention_backend="triton"),
               dict(q=torch.randn(4, HEADS, NOPE + ROPE)[::2]),                        # strides
               dict(block_table=other["block_table"].to(torch.int64)),                  # dtype
               dict(kv=torch.randn(1, LATENT + ROPE).expand(2, -1)),                    # stride 0 rows
               dict(attn_sinks=torch.zeros(HEADS))]
    for i, change in enumerate(changes):
        run(other, other_w, **change)
        assert len(counted_validation) == 2 + i, change
    for change in changes[:3]:                                           # those keys are kept
        run(other, other_w, **change)
    assert len(counted_validation) == 1 + len(changes)


@pytest.mark.parametrize("name,make", [
    ("input_row_offsets", lambda c: dict(input_row_offsets=torch.tensor([1, 1, 2], dtype=torch.int32))),
    ("cache_offsets", lambda c: dict(cache_offsets=torch.tensor([3, 100]))),
    ("block_table", lambda c: dict(block_table=c["block_table"].clone().fill_(99))),
    ("rope_interleave", lambda c: dict(rope_interleave=1)),                    # True was checked: 1 is not True
    ("max_seq_len", lambda c: dict(max_seq_len=True)),                         # 1 was checked
    ("softmax_scale", lambda c: dict(softmax_scale=True)),
    ("weight_block_size", lambda c: dict(weight_block_size=(True, 16))),
    ("weight_block_size", lambda c: dict(weight_block_size=[8.0, 16])),
    ("q", lambda c: dict(q=c["q"].tolist())),
    ("attention_backend", lambda c: dict(attention_backend=["reference"])),
])
def test_checked_key_keeps_every_check(counted_validation, name, make):
    """After a call was checked, the same metadata with bad values, or a scalar of another type, still raises
    MLAInputError naming the argument, before anything is written."""
    case, weights = make_case([1, 1], [3, 6], seed=23)
    run(case, weights)
    cache = case["latent_cache"]
    before = cache.clone()
    args = {"attention_backend": "reference", "backend": "reference", **case, **weights.kwargs(), **make(case)}
    pos = [args.pop(k) for k in ("q", "kv", "input_row_offsets", "freqs_cis", "kv_norm_gamma", "latent_cache",
                                 "block_table", "cache_offsets")]
    with pytest.raises(MLAInputError, match=name):
        mla_core.mla_forward(*pos, **args)
    assert torch.equal(cache.nan_to_num(7.0), before.nan_to_num(7.0))


def test_checked_calls_hold_no_tensor(counted_validation, monkeypatch):
    """The memo keeps metadata only (no tensor outlives its owner) and is cleared when full."""
    import weakref
    from mla_core import layer
    monkeypatch.setattr(layer, "_VALIDATED_MAX", 2)
    case, weights = make_case([1, 1], [3, 6], seed=24)
    q = case["q"].clone()
    ref = weakref.ref(q)
    run(case, weights, q=q)
    run(case, weights, epsilon=1e-3)
    run(case, weights, epsilon=1e-2)
    assert len(layer._VALIDATED) <= 2

    def tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from tensors(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                yield from tensors(v)
    assert not list(tensors(list(layer._VALIDATED.items())))
    del q
    assert ref() is None


@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("starts_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_content_checks_take_any_index_dtypes(offsets_dtype, starts_dtype, table_dtype):
    """The content checks read offsets, cache_offsets and the block table in one torch.cat, whatever mix of int32
    and int64 they come in: a good call gives the same output and key total, every bad value still names its
    argument."""
    from mla_core import layer
    case, weights = make_case([2, 1], [1, 3], seed=12)
    expected, _ = run(case, weights)
    mixed = dict(case, input_row_offsets=case["input_row_offsets"].to(offsets_dtype),
                 cache_offsets=case["cache_offsets"].to(starts_dtype), block_table=case["block_table"].to(table_dtype))
    assert torch.equal(run(mixed, weights)[0], expected)
    _, call = layer.validate_layer(
        *(mixed[k] for k in ("q", "kv", "input_row_offsets", "freqs_cis", "kv_norm_gamma", "latent_cache",
                             "block_table", "cache_offsets")),
        max_seq_len=mixed["max_seq_len"], softmax_scale=mixed["softmax_scale"], epsilon=mixed["epsilon"],
        attn_sinks=None, rope_interleave=True, attention_backend=None, **weights.kwargs())
    assert call.key_total == (1 + 2) + (3 + 1)
    bad = [("input_row_offsets", dict(input_row_offsets=torch.tensor([0, 2, 4], dtype=offsets_dtype))),
           ("cache_offsets", dict(cache_offsets=torch.tensor([1, -1], dtype=starts_dtype))),
           ("block_table", dict(block_table=mixed["block_table"].clone().fill_(99)))]
    for name, over in bad:
        with pytest.raises(MLAInputError, match=name):
            run(mixed, weights, **over)


@pytest.mark.parametrize("small_table", [0, 1 << 30])
def test_content_checks_block_table_paths(monkeypatch, small_table):
    """The page-range check in Python (small tables) and in torch (large ones) agree: pages past a request's length
    are never judged, a bad page within it is named (an int64 page past int32's range too), and one-element index
    tensors with a stride other than 1 are read right."""
    from mla_core import layer
    monkeypatch.setattr(layer, "_SMALL_TABLE", small_table)
    case, weights = make_case([1, 2, 1], [5, 0, 3], seed=14)
    expected, _ = run(case, weights)
    table = case["block_table"]                              # entries past each request's pages hold -1
    assert (table == -1).any()
    for bad, dtype in ((-3, torch.int32), (table.max().item() + 40, torch.int32), (1 << 40, torch.int64)):
        wrong = table.to(dtype, copy=True)
        wrong[1, 0] = bad
        with pytest.raises(MLAInputError, match=f"block_table: got page index {bad} "):
            run(case, weights, block_table=wrong)
    one, _ = make_case([1], [6], seed=15)
    strided = dict(one, cache_offsets=torch.tensor([0, 0, 6, 0, 0])[2::3])          # int64, shape [1], stride 3
    assert strided["cache_offsets"].stride() == (3,)
    assert torch.equal(run(strided, weights)[0], run(one, weights)[0])
    assert torch.equal(run(case, weights, block_table=table.long())[0], expected)


def test_fp8_weight_scale_rules():
    case, weights = make_case([2], [0], fp8=True, seed=13)
    with pytest.raises(MLAInputError, match="w_uk_scale"):
        run(case, weights, w_uk_scale=None)
    with pytest.raises(MLAInputError, match="w_uk_scale"):
        run(case, weights, w_uk_scale=weights.w_uk_scale[:, :1].contiguous())
    plain, plain_w = make_case([2], [0], seed=13)
    with pytest.raises(MLAInputError, match="w_uv_scale"):
        run(plain, plain_w, w_uv_scale=torch.ones(HEADS, 1, 1))


# --------------------------------------------------------------------------------------------------
# torch.compile


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_torch_compile(compiler):
    torch._dynamo.reset()
    case, weights = make_case([3, 2], [1, 4], fp8=True, sinks=True, seed=14)
    expected, expected_cache = run(case, weights)
    args = {**case, **weights.kwargs()}
    cache = args.pop("latent_cache").clone()

    def layer_step(q, kv, offsets, freqs, gamma, cache, table, starts):
        return mla_core.mla_forward(q, kv, offsets, freqs, gamma, cache, table, starts,
                                    max_seq_len=args["max_seq_len"], softmax_scale=args["softmax_scale"],
                                    epsilon=args["epsilon"], attn_sinks=args["attn_sinks"],
                                    attention_backend="reference", backend="reference", **weights.kwargs()) * 2.0

    compiled = torch.compile(layer_step, backend=compiler, fullgraph=True)
    out = compiled(case["q"], case["kv"], case["input_row_offsets"], case["freqs_cis"], case["kv_norm_gamma"], cache,
                   case["block_table"], case["cache_offsets"])
    assert rel_l2(out, expected * 2.0) < 1e-6
    assert torch.equal(cache.nan_to_num(3.0), expected_cache.nan_to_num(3.0))    # the cache write survived compile
