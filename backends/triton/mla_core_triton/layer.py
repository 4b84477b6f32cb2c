"""Triton fast path of the fused MLA layer (:func:`mla_core.mla_forward`), the reference layer's numerics up to rounding.

Per call (docs/layer.md, "The triton layer"):

- one Triton kernel (:func:`_prep_kernel`, one program per token) finds the token's request and position, writes the
  new cache row ``[rmsnorm(kv_latent) * gamma, rope(kv_rope)]`` (float32 math, one rounding to the cache dtype;
  rows whose page lies outside the table or the cache are not written), rotates ``q_rope`` into the attention's
  query buffer; for decode it writes each token's key count (and, when a request has no token, each token's
  block-table row), for a prefill without a cached prefix the key rows (zeros where the row was not written);
- the weights enter as cached tensors of the cache dtype (:class:`WeightCache`): dequantized once (FP8 code x block
  scale in float32, then rounded to the cache dtype) and reshaped for the GEMMs below, rebuilt when a weight or
  scale tensor is replaced or modified in place;
- decode: ``q_lat = q_nope @ w_uk`` as one batched GEMM over heads written straight into the absorbed query
  ``[tokens, heads, latent + rope]``, :func:`mla_core.mla_decode`, ``out = o_lat @ w_uv^T`` as one batched GEMM
  written straight into ``[tokens, heads, v]``. No host synchronization (CUDA-graph capturable) and a fixed,
  small number of launches;
- prefill: the key rows (the kernel's own new rows when no request has a cached prefix, else every request's
  cached rows gathered once), ``K = rows @ W_K^T`` with ``W_K`` [heads * (nope + rope),
  latent + rope] holding each head's ``w_k`` rows and an identity block for the rope columns, so one GEMM writes
  K in the ``[keys, heads, nope + rope]`` layout :func:`mla_core.mla_prefill` takes (the rope columns copied
  exactly), ``V = rows_latent @ w_uv^T`` straight into ``[keys, heads, v]``; the key count is read on the host
  (taken from the layer's content checks when they ran).

Differences from the reference: weights rounded to the cache dtype (bf16: relative 2^-9 per weight) instead of
exact float32, and GEMMs in the cache dtype with float32 accumulation (the reference multiplies in float32).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import weakref

import torch
import triton
import triton.language as tl

from mla_core import layer as layer_api
from mla_core import dispatch, mla_prefill, numerics, specs
from mla_core.specs import values_checked


def configs(problem) -> list[dict]:
    """Launch choice of the prep kernel: warps."""
    return [{"num_warps": 4}]


# --------------------------------------------------------------------------------------------------
# weights, dequantized and reshaped once


class WeightCache:
    """Derived weight tensors keyed on the source tensors' identity, storage address and version counter.

    An entry lives as long as its source weight (a weak reference drops it when the weight is freed) and is
    rebuilt when the weight or its scale is replaced, moved (``data_ptr``) or written in place (``_version``). Inside CUDA-graph
    capture a miss is computed but not stored (it belongs to the graph's memory pool). Memory: one derived
    tensor per (weight, kind): at DeepSeek-V3 sizes (bf16, 128 heads) ``uk`` 16 MB, ``uv`` 16 MB, ``k`` 28 MB.
    """

    def __init__(self):
        self._entries: dict[tuple, tuple] = {}

    @staticmethod
    def _version(t: torch.Tensor | None) -> tuple:
        if t is None:
            return ()
        try:
            return t.data_ptr(), t._version
        except RuntimeError:            # an inference tensor has no version counter: identity and storage only
            return t.data_ptr(), -1

    def get(self, kind: str, w: torch.Tensor, scale: torch.Tensor | None, extra: tuple, build):
        key = (kind, id(w), id(scale), extra)
        versions = (self._version(w), self._version(scale))
        hit = self._entries.get(key)
        if hit is not None:
            w_ref, s_ref, seen, value = hit
            if w_ref() is w and (s_ref is None if scale is None else s_ref() is scale) and seen == versions:
                return value
        value = build()
        if not (w.is_cuda and torch.cuda.is_current_stream_capturing()):
            entries = self._entries

            def drop(_ref, key=key):
                entries.pop(key, None)
            self._entries[key] = (weakref.ref(w, drop), None if scale is None else weakref.ref(scale, drop),
                                  versions, value)
        return value

    def clear(self) -> None:
        self._entries.clear()


WEIGHTS = WeightCache()


def _value(w, scale, block, name, dtype):
    """The weight's value in ``dtype``: exact float32 dequantization, one rounding."""
    return layer_api.dequantize_weight(w, scale, block, name).to(dtype)


def _w_uk(call, dtype):
    """[heads, nope, latent] (w_uk per head transposed: q_nope [H, T, nope] @ it = q_lat [H, T, latent])."""
    return WEIGHTS.get("uk", call.w_uk, call.w_uk_scale, (call.weight_block_size, dtype), lambda: _value(
        call.w_uk, call.w_uk_scale, call.weight_block_size, "w_uk", dtype).transpose(1, 2).contiguous())


def _w_uv(call, dtype):
    """[heads, v, latent] in ``dtype``."""
    return WEIGHTS.get("uv", call.w_uv, call.w_uv_scale, (call.weight_block_size, dtype), lambda: _value(
        call.w_uv, call.w_uv_scale, call.weight_block_size, "w_uv", dtype).contiguous())


def _w_k(call, dtype):
    """[heads * (nope + rope), latent + rope]: per head its w_k rows, then an identity over the rope columns."""
    heads, nope, rope, latent = call.heads, call.nope_dim, call.rope_dim, call.kv_lora_rank

    def build():
        w = torch.zeros(heads, nope + rope, latent + rope, dtype=dtype, device=call.w_k.device)
        w[:, :nope, :latent] = _value(call.w_k, call.w_k_scale, call.weight_block_size, "w_k", dtype).view(
            heads, nope, latent)
        w[:, nope:, latent:] = torch.eye(rope, dtype=dtype, device=w.device)
        return w.view(heads * (nope + rope), latent + rope)
    return WEIGHTS.get("k", call.w_k, call.w_k_scale, (call.weight_block_size, dtype, rope), build)


# --------------------------------------------------------------------------------------------------
# the prep kernel: positions, the cache write, q_rope


@triton.jit
def _rotate(x1, x2, cos, sin):
    """The rotated pair ``(x1 cos - x2 sin, x2 cos + x1 sin)`` (float32; the one form every rope path compiles):
    ``fma(cos, x1, -(sin x2))``, ``fma(sin, x1, cos x2)`` written out, so no Triton / LLVM version picks the other
    product to fuse (Triton 3.6 fused the other one after ``tl.split``; csrc/mla_layer_prep.cu's rotation)."""
    return tl.fma(cos, x1, -(sin * x2)), tl.fma(sin, x1, cos * x2)


@triton.jit
def _rotate_store(x1, x2, cos, sin, dst, half_offs, INTERLEAVE: tl.constexpr, HALF: tl.constexpr, mask):
    """Store ``rope([x1, x2])`` (float32 pairs) at ``dst`` + pair offsets (interleaved or split halves)."""
    r1, r2 = _rotate(x1, x2, cos, sin)
    if INTERLEAVE:
        tl.store(dst + 2 * half_offs, r1.to(dst.dtype.element_ty), mask=mask)
        tl.store(dst + 2 * half_offs + 1, r2.to(dst.dtype.element_ty), mask=mask)
    else:
        tl.store(dst + half_offs, r1.to(dst.dtype.element_ty), mask=mask)
        tl.store(dst + HALF + half_offs, r2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _prep_kernel(q_ptr, kv_ptr, offsets_ptr, starts_ptr, freqs_ptr, gamma_ptr, cache_ptr, table_ptr, qo_ptr,
                 tok_table_ptr, tok_len_ptr, rows_ptr,
                 stride_qt, stride_qh, stride_kvt, stride_f, stride_tb, stride_ot, stride_oh,
                 tokens, batch, heads, max_pos, num_pages, width, page_size, eps,
                 NOPE: tl.constexpr, ROPE: tl.constexpr, LATENT: tl.constexpr, BLOCK_LAT: tl.constexpr,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_NOPE: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_W: tl.constexpr, Q_ROPE_AT: tl.constexpr, COPY_NOPE: tl.constexpr,
                 INTERLEAVE: tl.constexpr, TOKEN_LEN: tl.constexpr, TOKEN_TABLE: tl.constexpr,
                 ROWS: tl.constexpr):
    t = tl.program_id(0)
    # the token's request: the number of offsets[1:] entries <= t (clamped: memory-safe whatever the offsets)
    b = t * 0                   # an int32 tensor: a loop-carried value keeps its type
    for start in range(0, batch, BLOCK_B):
        idx = start + tl.arange(0, BLOCK_B)
        ends = tl.load(offsets_ptr + 1 + idx, mask=idx < batch, other=tokens + 1).to(tl.int64)
        b += tl.sum((ends <= t).to(tl.int32), axis=0)
    b = tl.minimum(b, batch - 1)
    first = tl.load(offsets_ptr + b).to(tl.int64)
    pos = tl.load(starts_ptr + b).to(tl.int64) + t - first
    row = tl.minimum(tl.maximum(pos, 0), max_pos - 1)

    half = tl.arange(0, BLOCK_HALF)
    hmask = half < HALF
    cos = tl.load(freqs_ptr + row * stride_f + 2 * half, mask=hmask, other=0.0).to(tl.float32)
    sin = tl.load(freqs_ptr + row * stride_f + 2 * half + 1, mask=hmask, other=0.0).to(tl.float32)
    if INTERLEAVE:
        p1 = 2 * half
        p2 = 2 * half + 1
    else:
        p1 = half
        p2 = half + HALF

    # the new cache row
    kv_row = kv_ptr + t.to(tl.int64) * stride_kvt
    lat = tl.arange(0, BLOCK_LAT)
    lmask = lat < LATENT
    x = tl.load(kv_row + lat, mask=lmask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / LATENT + eps)
    gamma = tl.load(gamma_ptr + lat, mask=lmask, other=0.0).to(tl.float32)
    col = pos // page_size
    page = tl.load(table_ptr + b.to(tl.int64) * stride_tb + tl.minimum(tl.maximum(col, 0), width - 1)).to(tl.int64)
    ok = ((pos >= 0) & (col < width) & (page >= 0) & (page < num_pages)).to(tl.int32)
    dst = cache_ptr + (page * page_size + pos % page_size) * (LATENT + ROPE)
    # (scalar masks broadcast by arithmetic: Triton's interpreter refuses a scalar bool in a vector mask)
    tl.store(dst + lat, (x * inv * gamma).to(cache_ptr.dtype.element_ty), mask=lmask & (lat * 0 + ok != 0))
    k1 = tl.load(kv_row + LATENT + p1, mask=hmask, other=0.0).to(tl.float32)
    k2 = tl.load(kv_row + LATENT + p2, mask=hmask, other=0.0).to(tl.float32)
    _rotate_store(k1, k2, cos, sin, dst + LATENT, half, INTERLEAVE, HALF, hmask & (half * 0 + ok != 0))
    if ROWS:                # prefill without a cached prefix: the token's key row (zeros where not written)
        keep = lat * 0 + ok != 0
        r_row = rows_ptr + t.to(tl.int64) * (LATENT + ROPE)
        tl.store(r_row + lat, tl.where(keep, x * inv * gamma, 0.0).to(rows_ptr.dtype.element_ty), mask=lmask)
        keep_h = half * 0 + ok != 0
        _rotate_store(tl.where(keep_h, k1, 0.0), tl.where(keep_h, k2, 0.0), cos, sin, r_row + LATENT, half,
                      INTERLEAVE, HALF, hmask)

    # the query's rope part (and its nope part for prefill), BLOCK_H heads at a time
    hh = tl.arange(0, BLOCK_H)
    nn = tl.arange(0, BLOCK_NOPE)
    rr = tl.arange(0, 2 * BLOCK_HALF)
    for h0 in range(0, heads, BLOCK_H):
        h = h0 + hh
        m2 = (h < heads)[:, None] & hmask[None, :]
        q_row = q_ptr + t.to(tl.int64) * stride_qt + h[:, None].to(tl.int64) * stride_qh
        o_row = qo_ptr + t.to(tl.int64) * stride_ot + h[:, None].to(tl.int64) * stride_oh
        if COPY_NOPE and INTERLEAVE:
            # prefill: each head's rope row loaded and stored contiguously (16-byte vectors), its pairs split and
            # joined in registers (the stride-2 2-byte gathers and scatters of the decode form cost ~3x the floor)
            mr = (h < heads)[:, None] & (rr < ROPE)[None, :]
            xr = tl.load(q_row + NOPE + rr[None, :], mask=mr, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(xr, (BLOCK_H, BLOCK_HALF, 2)))
            r1, r2 = _rotate(x1, x2, cos[None, :], sin[None, :])
            rot = tl.reshape(tl.join(r1, r2), (BLOCK_H, 2 * BLOCK_HALF))
            tl.store(o_row + Q_ROPE_AT + rr[None, :], rot.to(qo_ptr.dtype.element_ty), mask=mr)
        else:
            x1 = tl.load(q_row + NOPE + p1[None, :], mask=m2, other=0.0).to(tl.float32)
            x2 = tl.load(q_row + NOPE + p2[None, :], mask=m2, other=0.0).to(tl.float32)
            _rotate_store(x1, x2, cos[None, :], sin[None, :], o_row + Q_ROPE_AT, half[None, :], INTERLEAVE, HALF,
                          m2)
        if COPY_NOPE:
            mn = (h < heads)[:, None] & (nn < NOPE)[None, :]
            tl.store(o_row + nn[None, :], tl.load(q_row + nn[None, :], mask=mn, other=0.0), mask=mn)

    if TOKEN_LEN:           # decode: each token's key count
        tl.store(tok_len_ptr + t, (pos + 1).to(tl.int32))
    if TOKEN_TABLE:         # decode with fewer tokens than requests: each token's block-table row
        for w0 in range(0, width, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            entries = tl.load(table_ptr + b.to(tl.int64) * stride_tb + w, mask=w < width, other=0)
            tl.store(tok_table_ptr + t.to(tl.int64) * width + w, entries, mask=w < width)


@functools.lru_cache(maxsize=256)
def _prep_constants(nope: int, rope: int, latent: int, heads: int, batch: int, width: int, q_rope_at: int,
                    copy_nope: bool, interleave: bool, with_len: bool, with_table: bool, rows: bool,
                    num_warps: int) -> dict:
    """The prep kernel's constexprs and launch options (a pure function of its arguments, cached)."""
    return dict(
        NOPE=nope, ROPE=rope, LATENT=latent, BLOCK_LAT=triton.next_power_of_2(latent), HALF=rope // 2,
        BLOCK_HALF=triton.next_power_of_2(rope // 2), BLOCK_NOPE=triton.next_power_of_2(nope),
        BLOCK_H=min(16, triton.next_power_of_2(heads)), BLOCK_B=min(1024, triton.next_power_of_2(max(batch, 1))),
        BLOCK_W=min(1024, triton.next_power_of_2(max(width, 1))), Q_ROPE_AT=q_rope_at, COPY_NOPE=copy_nope,
        INTERLEAVE=interleave, TOKEN_LEN=with_len, TOKEN_TABLE=with_table, ROWS=rows, num_warps=num_warps)


def _prep(call, q_out, q_rope_at: int, copy_nope: bool, token_table, token_len, config, rows=None) -> None:
    q, kv, cache, table = call.q, call.kv, call.latent_cache, call.block_table
    tokens, heads = q.shape[0], q.shape[1]
    batch = call.input_row_offsets.shape[0] - 1
    width = table.shape[1]
    with_table, with_len = token_table is not None, token_len is not None
    _prep_kernel[(tokens,)](
        q, kv, call.input_row_offsets, call.cache_offsets, call.freqs_cis, call.kv_norm_gamma, cache, table, q_out,
        token_table if with_table else table, token_len if with_len else call.cache_offsets,
        rows if rows is not None else cache,
        q.stride(0), q.stride(1), kv.stride(0), call.freqs_cis.stride(0), table.stride(0), q_out.stride(0),
        q_out.stride(1), tokens, batch, heads, call.freqs_cis.shape[0], cache.shape[0], width, cache.shape[1],
        call.epsilon, **_prep_constants(call.nope_dim, call.rope_dim, call.kv_lora_rank, heads, batch, width,
                                        q_rope_at, copy_nope, call.rope_interleave, with_len, with_table,
                                        rows is not None, config.get("num_warps", 4)))


# --------------------------------------------------------------------------------------------------
# the two paths


def _new_output(shape, dtype, device) -> torch.Tensor:
    """Allocate a buffer this module fully writes (tests replace this to poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """``out`` [T, H, v] times the sink factor (:func:`mla_core.numerics.sink_factor`; lse [T, H]), in place."""
    if sinks is not None:
        out.copy_(out.float() * numerics.sink_factor(lse, sinks)[..., None])
    return out


_DECODE_CALLS: dict[tuple, tuple] = {}
"""Validated inner decode calls by the metadata of their arguments: (Problem, the DecodeCall's fields other than
its tensors) (at most :data:`_DECODE_CALLS_MAX` keys; cleared when full)."""
_DECODE_CALLS_MAX = 256


def _inner_decode(call, q_dec, key_table, key_len):
    """(Problem, DecodeCall) of :func:`mla_core.mla_decode` of the absorbed query without its per-call checks.

    Its metadata checks (:func:`mla_core.specs.validate_decode`) run once per key of everything they read (each
    tensor's shape, dtype, device and strides, the scalars); a hit reuses that Problem and the validated call's
    other fields with this call's tensors. Its content checks are skipped as inside :func:`values_checked`: the
    layer checked offsets, lengths and pages, and these tensors are derived from them.
    """
    cache = call.latent_cache
    key = (tuple([(t.shape, t.dtype, t.device, t.stride()) for t in (q_dec, cache, key_table, key_len)]),
           call.softmax_scale, call.kv_lora_rank, call.rope_dim)
    hit = _DECODE_CALLS.get(key)
    if hit is None:
        with values_checked():
            hit = specs.validate_decode(
                q_dec, cache, key_table, key_len, softmax_scale=call.softmax_scale, kv_lora_rank=call.kv_lora_rank,
                qk_rope_head_dim=call.rope_dim, page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None,
                v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
        if len(_DECODE_CALLS) >= _DECODE_CALLS_MAX:
            _DECODE_CALLS.clear()
        problem, validated = hit      # its other fields, without the tensors (a cache must not outlive its owner)
        hit = problem, {f.name: getattr(validated, f.name) for f in dataclasses.fields(validated)
                        if f.name not in ("q", "latent_cache", "block_table", "seq_lens")}
        _DECODE_CALLS[key] = hit
    problem, fields = hit
    return problem, specs.DecodeCall(q=q_dec, latent_cache=cache, block_table=key_table, seq_lens=key_len, **fields)


def _cuda_prep_switch() -> bool:
    """``MLA_CORE_LAYER_CUDA_PREP``: unset or 1 (the CUDA prep where it applies), 0 (the Triton prep always)."""
    raw = os.environ.get("MLA_CORE_LAYER_CUDA_PREP", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"MLA_CORE_LAYER_CUDA_PREP={raw!r}: expected 0 (the Triton prep) or 1 (the CUDA prep "
                         "inside the cuda decode call where it applies)")
    return raw != "0"


CUDA_PREP = _cuda_prep_switch()
"""The switch of the decode's in-call prep (read each call; the environment variable ``MLA_CORE_LAYER_CUDA_PREP=0``
sets it False at import): when True and the backend dispatch chose for the decode's attention offers
``decode_with_prep`` (:meth:`mla_core.Backend.decode_prep_reason`; today the cuda backend, csrc/mla_layer_prep.cu),
the prep runs inside that backend's own call, bit-equal to :func:`_prep_kernel`, instead of as a Triton launch of
its own (~60-70 us of host time a step on the H200); else, and for every other case, the Triton prep."""


def _prep_order(version: str) -> int:
    """The sum_order of the CUDA prep equal to the Triton prep of Triton ``version`` (csrc/mla_layer_prep.cu): a
    thread's squares summed as a tree from 3.7 (triton-lang/triton#9220) and as a left fold before (the rotation
    needs none: :func:`_rotate` writes its fma out). ``MLA_CORE_LAYER_PREP_ORDER=S`` (0..2) overrides it (a device
    whose Triton sums otherwise; benchmarks/run_layer_prep_ab.sh tries each when a bit-equality test fails)."""
    raw = os.environ.get("MLA_CORE_LAYER_PREP_ORDER", "").strip()
    if raw:
        if raw not in ("0", "1", "2"):
            raise ValueError(f"MLA_CORE_LAYER_PREP_ORDER={raw!r}: expected the sum order 0, 1 or 2")
        return int(raw)
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", version).groups())
    return 1 if (major, minor) < (3, 7) else 0


_PREP_ORDER = _prep_order(triton.__version__)
_PREP_DTYPES = (torch.bfloat16, torch.float16)
_GAMMA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _prep_in_decode(call, backend) -> specs.LayerDecodePrep | None:
    """The prep of :func:`_decode` (one token per request) for ``backend.run_decode_with_prep``, or None when the
    Triton prep runs: the switch off, a backend without the path, or a layout whose Triton prep order the
    :class:`~mla_core.specs.LayerDecodePrep` orders do not name (cache dtype other than bf16 / fp16, freqs not
    float32, gamma, offsets or the block table's rows not contiguous, kv not 16-byte aligned or its row stride not a
    multiple of 16: Triton then loads the row one element per thread and sums the squares in another order; gamma
    or the cache not 16-byte aligned: a layout Triton could pick for the row then was not read from its PTX)."""
    if not CUDA_PREP or backend.decode_prep_reason() is not None:
        return None
    gamma, table, kv = call.kv_norm_gamma, call.block_table, call.kv
    if (call.latent_cache.dtype not in _PREP_DTYPES or call.freqs_cis.dtype != torch.float32
            or kv.data_ptr() % 16 or kv.stride(0) % 16      # the Triton prep's vectorized (summation) layout
            or gamma.data_ptr() % 16 or call.latent_cache.data_ptr() % 16
            or gamma.dtype not in _GAMMA_DTYPES or not gamma.is_contiguous() or table.stride(1) != 1
            or not call.input_row_offsets.is_contiguous() or not call.cache_offsets.is_contiguous()):
        return None
    return specs.LayerDecodePrep(call.q, kv, call.input_row_offsets, call.cache_offsets, call.freqs_cis, gamma,
                                 call.epsilon, call.rope_interleave, _PREP_ORDER)


def _decode(call, config):
    q, cache = call.q, call.latent_cache
    tokens, heads = q.shape[0], q.shape[1]
    batch = call.input_row_offsets.shape[0] - 1
    latent, rope, nope, dtype = call.kv_lora_rank, call.rope_dim, call.nope_dim, cache.dtype
    q_dec = _new_output((tokens, heads, latent + rope), dtype, q.device)
    torch.bmm(q[..., :nope].transpose(0, 1), _w_uk(call, dtype), out=q_dec[..., :latent].transpose(0, 1))
    key_len = _new_output((tokens,), torch.int32, q.device)
    if tokens == batch:     # one token per request (max_seq_len 1): token t is request t
        key_table, tok_table = call.block_table, None
    else:
        tok_table = key_table = _new_output((tokens, call.block_table.shape[1]), call.block_table.dtype, q.device)
    problem, inner = _inner_decode(call, q_dec, key_table, key_len)
    choice = dispatch.choose(problem, call.attention_backend)    # reads no tensor: the prep may run after it
    prep = _prep_in_decode(call, choice.backend) if tok_table is None else None
    if prep is not None:    # the prep inside the decode backend's own call
        o_lat, lse = choice.backend.run_decode_with_prep(problem, inner, choice.config, prep)
    else:
        _prep(call, q_dec, latent, False, tok_table, key_len, config)
        o_lat, lse = choice.backend.run(problem, inner, choice.config)
    out = _new_output((tokens, heads, call.v_dim), q.dtype, q.device)
    torch.bmm(o_lat.transpose(0, 1), _w_uv(call, dtype).transpose(1, 2), out=out.transpose(0, 1))
    return _sinks(out, lse, call.attn_sinks)


def _prefill(call, config):
    q, cache = call.q, call.latent_cache
    tokens, heads = q.shape[0], q.shape[1]
    latent, rope, nope, v_dim, dtype = call.kv_lora_rank, call.rope_dim, call.nope_dim, call.v_dim, cache.dtype
    q_pre = _new_output((tokens, heads, nope + rope), dtype, q.device)
    offsets = call.input_row_offsets
    kv_lens = cu_k = None
    total = call.key_total                       # read by the layer's content checks, else read here
    if total is None:
        kv_lens, cu_k = _key_counts(call)
        total = int(cu_k[-1])
    if total == tokens:      # no cached prefix (cache_offsets all 0): the keys are the new rows, in token order
        rows = _new_output((tokens, latent + rope), dtype, q.device)
        _prep(call, q_pre, nope, True, None, None, config, rows=rows)
        cu_k = offsets       # one cu_seqlens tensor for queries and keys (the attention may see a dense batch)
    else:
        _prep(call, q_pre, nope, True, None, None, config)
        if cu_k is None:
            kv_lens, cu_k = _key_counts(call)
        rows = _key_rows(cache, call.block_table, kv_lens, cu_k, total)
    k = (rows @ _w_k(call, dtype).T).view(-1, heads, nope + rope)
    v = (rows[:, :latent] @ _w_uv(call, dtype).view(heads * v_dim, latent).T).view(-1, heads, v_dim)
    sinks = call.attn_sinks is not None          # the LSE only when sinks need it (not every backend's fast path
    with values_checked():                        # computes it for free)
        res = mla_prefill(q_pre, k, v, offsets, cu_k, call.max_seq_len, call.softmax_scale, causal=True,
                          return_lse=sinks, backend=call.attention_backend)
    out, lse = res if sinks else (res, None)
    out = out.to(q.dtype)
    out = out if out.is_contiguous() else out.contiguous()
    return _sinks(out, lse.T, call.attn_sinks) if sinks else out


def _key_counts(call):
    """Keys per request ``cache_offsets + lengths`` [batch] and their cumulative counts ``cu_k`` [batch + 1], int64."""
    offsets = call.input_row_offsets.to(torch.int64)
    kv_lens = call.cache_offsets.to(torch.int64) + (offsets[1:] - offsets[:-1])
    return kv_lens, layer_api.cumulative_counts(kv_lens)


def _key_rows(cache: torch.Tensor, table: torch.Tensor, kv_lens: torch.Tensor, cu_k: torch.Tensor, total: int):
    """Every request's cached rows ``0..kv_lens[b] - 1`` packed in request order: rows [total, D] (a row whose page
    lies outside the table or the cache reads as zeros)."""
    page, slot, ok = layer_api.key_coordinates(table, kv_lens, cu_k, total, cache.shape[1], cache.shape[0])
    return torch.where(ok[:, None], cache[page, slot], 0)


def run(call, config: dict) -> torch.Tensor:
    """One validated :class:`mla_core.layer.LayerCall` (no sparse indices): out [tokens, heads, v] in q's dtype."""
    if call.q.shape[0] == 0:
        return torch.zeros(0, call.heads, call.v_dim, dtype=call.q.dtype, device=call.q.device)
    if call.q.stride(-1) != 1 or call.kv.stride(-1) != 1 or call.freqs_cis.stride(-1) != 1:   # the kernel's rows
        call = dataclasses.replace(call, q=call.q.contiguous(), kv=call.kv.contiguous(),
                                   freqs_cis=call.freqs_cis.contiguous())
    return _decode(call, config) if call.decode else _prefill(call, config)
