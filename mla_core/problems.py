"""Random, valid call arguments for a :class:`~mla_core.problem.Problem`: what the autotuner times and checks.

:func:`make_call` turns a problem key (bucketed batch and lengths) back into concrete arguments of
that shape, validates them through :mod:`mla_core.specs` (so backends receive exactly what a user call
would give them) and checks that they reduce to the same problem. Sizes are the top of each bucket
(batch = the batch bucket, block-table capacity = the length bucket) so a tuned choice is timed at the
worst shape its key covers; KV lengths are random in the upper half of the capacity.

Tensors are drawn on the problem's device with a device generator: warm-up builds multi-GB DeepSeek
caches, which a CPU generator would make slow (:mod:`mla_core.samples` builds small CPU-first inputs
with poison for correctness tests instead).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from . import specs
from .problem import Problem


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


def _amax(x: torch.Tensor, fmt: str | None) -> float | None:
    """Per-tensor amax a calibrated caller would pass for a quantized operand (None when not quantized)."""
    return float(x.abs().max().float()) if fmt is not None and x.numel() else None


def _decode(p: Problem, r: _Rand):
    batch, page = p["batch"], p["page_size"]
    dim = p["kv_lora_rank"] + p["rope_dim"]
    max_pages = max(1, p["max_len"] // page)
    capacity = max_pages * page
    cache = r.normal((batch * max_pages, page, dim), _dtype(p["dtype"]))
    table = r.perm(batch * max_pages).view(batch, max_pages).to(torch.int32)
    lens = r.ints(capacity // 2 + 1 if capacity > 1 else 1, capacity, (batch,)).to(torch.int32)
    q = r.normal((batch, p["heads"], dim), _dtype(p["q_dtype"]))
    splits = p["num_kv_splits"]
    kqdq, vqdq = p["k_qdq"], p["v_qdq"]
    return specs.validate_decode(
        q, cache, table, lens, softmax_scale=dim ** -0.5, kv_lora_rank=p["kv_lora_rank"],
        qk_rope_head_dim=p["rope_dim"], page_size=page, num_kv_splits=splits, k_qdq=kqdq,
        k_qdq_amax=_amax(cache, kqdq), v_qdq=vqdq, v_qdq_amax=_amax(cache[..., :p["kv_lora_rank"]], vqdq),
        p_qdq=p["p_qdq"], p_qdq_amax=1.0, return_lse="lse" in p.features, out_dtype=_dtype(p["out_dtype"]))


def _prefill(p: Problem, r: _Rand):
    batch, len_q, total_k = p["batch"], p["max_seqlen_q"], p["total_k"]
    heads, kv_heads, dtype = p["heads"], p["kv_heads"], _dtype(p["dtype"])
    k_lens = [total_k // batch + (1 if i < total_k % batch else 0) for i in range(batch)]
    cu_q = torch.arange(0, (batch + 1) * len_q, len_q, dtype=torch.int32, device=r.device)
    cu_k = torch.tensor([0] + [sum(k_lens[:i + 1]) for i in range(batch)], dtype=torch.int32, device=r.device)
    q = r.normal((batch * len_q, heads, p["qk_dim"]), dtype)
    k = r.normal((total_k, kv_heads, p["qk_dim"]), dtype)
    v = r.normal((total_k, kv_heads, p["v_dim"]), dtype)
    m = p["sparsity_m"] or 4
    return specs.validate_prefill(
        q, k, v, cu_q, cu_k, len_q, None, bool(p["causal"]), "lse" in p.features,
        q_quant=p["q_quant"], k_quant=p["k_quant"], p_quant=p["p_quant"], v_quant=p["v_quant"],
        q_amax=_amax(q, p["q_quant"]), k_amax=_amax(k, p["k_quant"]), p_amax=1.0, v_amax=_amax(v, p["v_quant"]),
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
