"""Random, valid inputs for every op, in one place: what the demo, ``mla-core check``, tests and the autotuner run.

Two kinds of builder:

* :func:`decode_inputs`, :func:`prefill_inputs`, ... return keyword arguments of a public op for explicit
  sizes, CPU-first, with poison where nothing may be read (NaN pages, out-of-range page indices past each
  length): correctness checks.
* :func:`make_call` turns a :class:`~mla_core.problem.Problem` (bucketed batch and lengths) back into a
  validated call object of that shape on the problem's device, drawn with a device generator (warm-up
  builds multi-GB DeepSeek caches): what the autotuner times. Sizes are the top of each bucket (batch =
  the batch bucket, block-table capacity = the length bucket) so a tuned choice is timed at the worst
  shape its key covers; KV lengths are random in the upper half of the capacity.

Inputs are random normal values, never zeros.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import torch

from . import specs
from .problem import Problem


def _gen(seed: int, device) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _randn(shape, g, dtype, device, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g, dtype=torch.float32, device="cpu") * scale).to(dtype).to(device)


def decode_inputs(lengths, heads=16, page_size=64, kv_lora_rank=512, rope_dim=64, dtype=torch.bfloat16,
                  q_dtype=None, device="cpu", seed=0, spare_pages=2) -> dict:
    """Arguments of :func:`mla_core.mla_decode` for requests of the given KV ``lengths``.

    Pages are shuffled across the cache; ``spare_pages`` extra pages and the slots past each length on
    a request's last page are NaN, and every block-table entry past a request's last page is an
    out-of-range index.
    """
    g = _gen(seed, device)
    batch, dim = len(lengths), kv_lora_rank + rope_dim
    pages_per_req = [-(-int(n) // page_size) for n in lengths]
    max_pages = max([1] + pages_per_req)
    used = sum(pages_per_req)
    num_pages = used + spare_pages
    cache = _randn((num_pages, page_size, dim), g, dtype, device)
    perm = torch.randperm(num_pages, generator=g, device="cpu")
    spare = perm[used:]
    cache[spare.to(device)] = float("nan")
    table = torch.full((batch, max_pages), num_pages + 1000, dtype=torch.int32, device="cpu")
    start = 0
    for b, n in enumerate(pages_per_req):
        table[b, :n] = perm[start:start + n].to(torch.int32)
        start += n
        tail = int(lengths[b]) - (n - 1) * page_size  # tokens on the request's last page
        if n and tail < page_size:
            cache[int(table[b, n - 1]), tail:] = float("nan")
    q = _randn((batch, heads, dim), g, q_dtype or dtype, device)
    return dict(q=q, latent_cache=cache, block_table=table.to(device),
                b_seq_len=torch.tensor(list(lengths), dtype=torch.int32, device=device),
                softmax_scale=(128 + rope_dim) ** -0.5, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope_dim)


def prefill_inputs(q_lens, k_lens=None, heads=16, kv_heads=None, qk_dim=192, v_dim=128, dtype=torch.bfloat16,
                   device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.mla_prefill` for a varlen batch (``k_lens`` default: ``q_lens``)."""
    g = _gen(seed, device)
    k_lens = list(q_lens) if k_lens is None else list(k_lens)
    kv_heads = heads if kv_heads is None else kv_heads
    tq, tk = sum(q_lens), sum(k_lens)
    cu_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *itertools.accumulate(k_lens)], dtype=torch.int32, device=device)
    return dict(q=_randn((tq, heads, qk_dim), g, dtype, device), k=_randn((tk, kv_heads, qk_dim), g, dtype, device),
                v=_randn((tk, kv_heads, v_dim), g, dtype, device), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                max_seqlen_q=max([0] + list(q_lens)))


def merge_inputs(tokens, heads=16, head_dim=512, dtype=torch.bfloat16, device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.merge_attn_states` (a few rows have one or both LSEs at -inf)."""
    g = _gen(seed, device)
    lse_a = torch.randn((heads, tokens), generator=g, dtype=torch.float32, device="cpu") * 3
    lse_b = torch.randn((heads, tokens), generator=g, dtype=torch.float32, device="cpu") * 3
    if tokens:
        lse_a[:, 0] = float("-inf")
        lse_b[0, -1] = float("-inf")
        lse_a[0, -1] = float("-inf")
    return dict(prefix_output=_randn((tokens, heads, head_dim), g, dtype, device), prefix_lse=lse_a.to(device),
                suffix_output=_randn((tokens, heads, head_dim), g, dtype, device), suffix_lse=lse_b.to(device))


def rope_inputs(nnz, heads=16, rope_dim=64, nope_dim=512, max_pos=4096, dtype=torch.bfloat16,
                cos_dtype=torch.float32, device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.mla_rope_quantize_fp8` with a real cos/sin cache (base 10000)."""
    g = _gen(seed, device)
    half = rope_dim // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64, device="cpu") / half))
    ang = torch.arange(max_pos, dtype=torch.float64, device="cpu")[:, None] * inv_freq[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=1).to(cos_dtype).to(device)
    return dict(q_rope=_randn((nnz, heads, rope_dim), g, dtype, device), k_rope=_randn((nnz, rope_dim), g, dtype, device),
                q_nope=_randn((nnz, heads, nope_dim), g, dtype, device), k_nope=_randn((nnz, nope_dim), g, dtype, device),
                cos_sin_cache=cache, pos_ids=torch.randint(0, max_pos, (nnz,), generator=g, device="cpu").to(device))


def sparse_decode_inputs(batch, q_len=1, heads=16, top_k=64, num_pages=8, page_size=64, seq_lens=None,
                         device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.sparse_mla_fp8_decode` (some slots -1, garbage past each ``seq_lens``)."""
    g = _gen(seed, device)
    full = specs.SPARSE_LATENT + specs.SPARSE_ROPE
    rows = num_pages * page_size
    fp8 = specs.FP8
    query = (torch.randn((batch, q_len, heads, full), generator=g, dtype=torch.float32, device="cpu")).to(fp8).to(device)
    cache = (torch.randn((num_pages, page_size, full), generator=g, dtype=torch.float32, device="cpu")).to(fp8).to(device)
    idx = torch.randint(0, rows, (batch, q_len, top_k), generator=g, dtype=torch.int64, device="cpu").to(torch.int32)
    idx[..., ::7] = -1
    if seq_lens is None:
        seq_lens = [top_k - (b * 13) % top_k for b in range(batch)]
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cpu")
    past = torch.arange(top_k, device="cpu")[None, None, :] >= lens[:, None, None]
    idx[past.expand_as(idx)] = rows + 12345
    return dict(query=query, kv_cache=cache, workspace_buffer=None, qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=idx.to(device), seq_lens=lens.to(device), max_seq_len=rows,
                sparse_mla_top_k=top_k, bmm1_scale=full ** -0.5, bmm2_scale=1.0)


# --------------------------------------------------------------------------------------------------
# problem -> call (the autotuner)


class ProblemInputsError(ValueError):
    """No concrete arguments reduce to this problem (e.g. a page larger than the length bucket)."""


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


class _Rand:
    """Random tensors on one device from one seeded generator."""

    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def normal(self, shape, dtype, scale: float = 1.0) -> torch.Tensor:
        x = torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (x * scale).to(dtype) if scale != 1.0 else x.to(dtype)

    def ints(self, lo: int, hi: int, shape) -> torch.Tensor:
        """Integers in ``[lo, hi]`` (int64)."""
        return torch.randint(lo, hi + 1, shape, generator=self.gen, device=self.device)

    def perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen, device=self.device)


CALIBRATED_AMAX = 4.0
"""The per-tensor amax :func:`make_call` passes for every quantized operand, its values clamped to it: one
constant, as a calibrated model passes, so every input set of a problem (and the compile-ahead run of its
kind) meets the same kernel specialization (Triton kernels specialize on whether a scale is a power of two
and on K and V sharing one); an amax measured per set changed them from set to set and recompiled mid-timing."""


def _calibrated(x: torch.Tensor, fmt: str | None) -> tuple[torch.Tensor, float | None]:
    """``x`` clamped to :data:`CALIBRATED_AMAX` and that amax for a quantized operand; ``(x, None)`` when not quantized."""
    if fmt is None:
        return x, None
    return x.clamp(-CALIBRATED_AMAX, CALIBRATED_AMAX), CALIBRATED_AMAX


def _decode(p: Problem, r: _Rand):
    batch, page = p["batch"], p["page_size"]
    dim = p["kv_lora_rank"] + p["rope_dim"]
    max_pages = max(1, p["max_len"] // page)
    capacity = max_pages * page
    kqdq, vqdq = p["k_qdq"], p["v_qdq"]
    cache, k_amax = _calibrated(r.normal((batch * max_pages, page, dim), torch.float32), kqdq or vqdq)
    kv_scale = None
    if p["dtype"] == "float8_e4m3fn":  # an FP8 cache: the codes of those values at a calibrated scale
        kv_scale = float(cache.abs().max()) / 448 if cache.numel() else 1.0
        cache = (cache / kv_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:
        cache = cache.to(_dtype(p["dtype"]))
    table = r.perm(batch * max_pages).view(batch, max_pages).to(torch.int32)
    lens = r.ints(capacity // 2 + 1 if capacity > 1 else 1, capacity, (batch,)).to(torch.int32)
    q = r.normal((batch, p["heads"], dim), _dtype(p["q_dtype"]))
    splits = p["num_kv_splits"]
    return specs.validate_decode(
        q, cache, table, lens, softmax_scale=dim ** -0.5, kv_lora_rank=p["kv_lora_rank"],
        qk_rope_head_dim=p["rope_dim"], page_size=page, num_kv_splits=splits, k_qdq=kqdq,
        k_qdq_amax=k_amax if kqdq else None, v_qdq=vqdq, v_qdq_amax=k_amax if vqdq else None,
        p_qdq=p["p_qdq"], p_qdq_amax=1.0, return_lse="lse" in p.features, out_dtype=_dtype(p["out_dtype"]),
        kv_scale=kv_scale)


def _prefill(p: Problem, r: _Rand):
    batch, len_q, total_k = p["batch"], p["max_seqlen_q"], p["total_k"]
    heads, kv_heads, dtype = p["heads"], p["kv_heads"], _dtype(p["dtype"])
    cu_q = torch.arange(0, (batch + 1) * len_q, len_q, dtype=torch.int32, device=r.device)
    if p.get("dense_batch") and batch > 1:  # one cu_seqlens tensor for q and k (specs.prefill_dense_batch)
        cu_k, total_k = cu_q, batch * len_q
    else:
        k_lens = [total_k // batch + (1 if i < total_k % batch else 0) for i in range(batch)]
        cu_k = torch.tensor([0] + [sum(k_lens[:i + 1]) for i in range(batch)], dtype=torch.int32, device=r.device)
    q, q_amax = _calibrated(r.normal((batch * len_q, heads, p["qk_dim"]), dtype), p["q_quant"])
    k, k_amax = _calibrated(r.normal((total_k, kv_heads, p["qk_dim"]), dtype), p["k_quant"])
    v, v_amax = _calibrated(r.normal((total_k, kv_heads, p["v_dim"]), dtype), p["v_quant"])
    m = p["sparsity_m"] or 4
    return specs.validate_prefill(
        q, k, v, cu_q, cu_k, len_q, None, bool(p["causal"]), "lse" in p.features,
        q_quant=p["q_quant"], k_quant=p["k_quant"], p_quant=p["p_quant"], v_quant=p["v_quant"],
        q_amax=q_amax, k_amax=k_amax, p_amax=1.0, v_amax=v_amax,
        sparsity_n=m // 2 if p["sparsity_m"] else 0, sparsity_m=m, dense_sink_tokens=0, dense_recent_tokens=64,
        block_m=64, block_n=p["block_n"])


def _merge(p: Problem, r: _Rand):
    tokens, heads, dim, dtype = p["tokens"], p["heads"], p["head_dim"], _dtype(p["dtype"])
    out_dtype = _dtype(p["out_dtype"])
    output = torch.empty((tokens, heads, dim), dtype=out_dtype, device=r.device) if out_dtype != dtype else None
    return specs.validate_merge(r.normal((tokens, heads, dim), dtype), r.normal((heads, tokens), torch.float32, 3.0),
                                r.normal((tokens, heads, dim), dtype), r.normal((heads, tokens), torch.float32, 3.0),
                                output, None)


def _rope(p: Problem, r: _Rand):
    tokens, heads, rope, nope, dtype = p["tokens"], p["heads"], p["rope_dim"], p["nope_dim"], _dtype(p["dtype"])
    max_pos = max(16, 2 * tokens)
    half = rope // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64, device=r.device) / half))
    angle = torch.arange(max_pos, dtype=torch.float64, device=r.device)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angle.cos(), angle.sin()], dim=1).to(_dtype(p["cos_dtype"]))
    return specs.validate_rope_quantize(
        r.normal((tokens, heads, rope), dtype), r.normal((tokens, rope), dtype), r.normal((tokens, heads, nope), dtype),
        r.normal((tokens, nope), dtype), cos_sin, r.ints(0, max_pos - 1, (tokens,)), bool(p["neox"]), None, 1.0, 1.0,
        None, None, None, None)


def _sparse_decode(p: Problem, r: _Rand):
    batch, q_len, heads, top_k = p["batch"], p["q_len"], p["heads"], p["top_k"]
    full = p["kv_lora_rank"] + p["rope_dim"]
    page = 64
    pages = max(1, math.ceil(batch * top_k / page))
    rows = pages * page
    query = r.normal((batch, q_len, heads, full), specs.FP8)
    cache = r.normal((pages, page, full), specs.FP8)
    index = r.ints(0, rows - 1, (batch, q_len, top_k)).to(torch.int32)
    lens = r.ints(top_k // 2 + 1, top_k, (batch,)).to(torch.int32)
    return specs.validate_sparse_decode(query, cache, 128, p["kv_lora_rank"], p["rope_dim"], index, lens, top_k, None,
                                        full ** -0.5, 1.0, None, "lse" in p.features, None)


_BUILDERS = {"decode": _decode, "prefill": _prefill, "merge": _merge, "rope_quantize_fp8": _rope,
             "sparse_decode": _sparse_decode}


def make_call(problem: Problem, device: torch.device | str | None = None, seed: int = 0) -> Any:
    """A validated call object (``specs.*Call``) of ``problem``'s shape on ``device`` (default: the problem's type).

    Raises :class:`ProblemInputsError` when no valid arguments reduce to exactly ``problem``.
    """
    device = torch.device(device if device is not None else problem.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    try:
        built, call = _BUILDERS[problem.op](problem, _Rand(device, seed))
    except KeyError as exc:
        raise ProblemInputsError(f"cannot build inputs for {problem.describe()}: missing parameter {exc}") from None
    except specs.MLAInputError as exc:
        raise ProblemInputsError(f"cannot build inputs for {problem.describe()}: {exc}") from None
    if built != problem:
        raise ProblemInputsError(f"no arguments reduce to {problem.key()} (the nearest is {built.key()})")
    return call


def call_nbytes(call: Any) -> int:
    """Bytes of every tensor a call object holds (its input working set)."""
    return sum(v.numel() * v.element_size() for v in (getattr(call, f.name) for f in dataclasses.fields(call))
               if isinstance(v, torch.Tensor))


def output_buffers(call: Any) -> list[torch.Tensor]:
    """The caller-given output tensors of a call (written by the kernel): poisoned before a checked run."""
    names = ("out", "lse", "output", "output_lse", "q_rope_out", "k_rope_out", "q_nope_out", "k_nope_out")
    return [t for t in (getattr(call, n, None) for n in names) if isinstance(t, torch.Tensor)]
