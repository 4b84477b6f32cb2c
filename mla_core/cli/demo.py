"""``mla-core demo``: a DeepSeek-shaped decode and a two-chunk prefill, with who served them and their error."""
from __future__ import annotations

import json
import time

import torch

from .. import dispatch, inputs, ops, specs
from ..accuracy import REFERENCE, compare
from .table import table


def _served_by(problem) -> str:
    return dispatch.choose(problem).backend.name


def run_demo(device: str, as_json: bool = False) -> int:
    """Run the demo on ``device``; print a table (or JSON). Returns 0, or 1 when an op disagrees with the reference."""
    rows = []

    def record(op: str, shape: str, problem, fn):
        backend = _served_by(problem)
        t0 = time.perf_counter()
        result = fn(None)
        if device == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        err = compare(result, fn(REFERENCE)) if backend != REFERENCE else 0.0
        rows.append({"op": op, "shape": shape, "backend": backend, "ms": ms, "rel_l2_vs_reference": err})
        return result

    # Absorbed decode: DeepSeek-V3 at TP=8 (16 heads), 576 = 512 latent + 64 rope, 64-token pages.
    lengths = [1, 300, 1000, 17] if device == "cpu" else [1, 3000, 8192, 17, 512, 4096, 77, 1024]
    dk = inputs.decode_inputs(lengths, heads=16, page_size=64, device=device, seed=0)
    problem, _ = specs.validate_decode(**dk, page_size=None, num_kv_splits=32, k_qdq=None, k_qdq_amax=None, v_qdq=None,
                                       v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    record("mla_decode", f"batch={len(lengths)} heads=16 576/512 page=64 lens={lengths}", problem,
           lambda b: ops.mla_decode(**dk, backend=b))
    fq = {"k_qdq": "nvfp4", "v_qdq": "nvfp4", "p_qdq": "nvfp4"}
    problem, _ = specs.validate_decode(**dk, page_size=None, num_kv_splits=32, **fq, k_qdq_amax=None,
                                       v_qdq_amax=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    record("mla_decode nvfp4 K/V/P", f"batch={len(lengths)} heads=16 576/512 page=64", problem,
           lambda b: ops.mla_decode(**dk, **fq, backend=b))

    # Prefill (un-absorbed, 192/128), split into a cached-context chunk and a causal new chunk, merged.
    ctx, new = ([200, 0], [56, 40]) if device == "cpu" else ([3000, 0], [1096, 512])
    heads = 16
    full = inputs.prefill_inputs([c + n for c, n in zip(ctx, new)], heads=heads, device=device, seed=1)
    q, k, v = full["q"], full["k"], full["v"]
    starts = full["cu_seqlens_k"].tolist()
    q_new = torch.cat([q[s + c:s + c + n] for s, c, n in zip(starts, ctx, new)])
    k_ctx = torch.cat([k[s:s + c] for s, c in zip(starts, ctx)])
    v_ctx = torch.cat([v[s:s + c] for s, c in zip(starts, ctx)])
    k_new = torch.cat([k[s + c:s + c + n] for s, c, n in zip(starts, ctx, new)])
    v_new = torch.cat([v[s + c:s + c + n] for s, c, n in zip(starts, ctx, new)])
    cu = lambda lens: torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    chunk_args = dict(cu_seqlens_q=cu(new), max_seqlen_q=max(new))
    ctx_args = (q_new, k_ctx, v_ctx, chunk_args["cu_seqlens_q"], cu(ctx), chunk_args["max_seqlen_q"])
    new_args = (q_new, k_new, v_new, chunk_args["cu_seqlens_q"], cu(new), chunk_args["max_seqlen_q"])
    kw = dict(q_amax=None, k_amax=None, p_amax=1.0, v_amax=None, q_quant=None, k_quant=None, p_quant=None,
              v_quant=None, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64,
              block_n=64)
    p_ctx, _ = specs.validate_prefill(*ctx_args, None, False, True, **kw)
    p_new, _ = specs.validate_prefill(*new_args, None, True, True, **kw)
    shape = f"heads={heads} 192/128 context={ctx} new={new}"
    o1, l1 = record("mla_prefill context (causal=False)", shape, p_ctx,
                    lambda b: ops.mla_prefill(*ctx_args, causal=False, return_lse=True, backend=b))
    o2, l2 = record("mla_prefill new chunk (causal=True)", shape, p_new,
                    lambda b: ops.mla_prefill(*new_args, causal=True, return_lse=True, backend=b))
    p_merge, _ = specs.validate_merge(o1, l1, o2, l2, None, None)
    merged, _ = record("merge_attn_states", f"tokens={sum(new)} heads={heads} dim=128", p_merge,
                       lambda b: ops.merge_attn_states(o1, l1, o2, l2, backend=b))
    one_shot = ops.mla_prefill(q_new, k, v, chunk_args["cu_seqlens_q"], full["cu_seqlens_k"], max(new), causal=True,
                               backend=REFERENCE)
    chunk_err = compare(merged, one_shot)

    if as_json:
        print(json.dumps({"device": device, "ops": rows, "two_chunk_vs_one_shot_rel_l2": chunk_err}, indent=2))
    else:
        print(f"mla-core demo on {device} (backend chosen automatically; error = relative L2 against the reference backend)")
        print(table([[r["op"], r["shape"], r["backend"], f"{r['ms']:.1f}", f"{r['rel_l2_vs_reference']:.1e}"] for r in rows],
                     ["op", "shape", "served by", "ms", "rel L2 vs reference"]))
        print(f"two-chunk prefill merged vs one-shot prefill (reference): rel L2 {chunk_err:.1e}")
        if device == "cpu":
            print("no GPU here: the reference backend serves every op (triton and cuda need CUDA).")
    ok = all(r["rel_l2_vs_reference"] < 1e-2 for r in rows) and chunk_err < 1e-2
    return 0 if ok else 1
