"""Prefill benchmark on the GPU: torch SDPA (cuDNN backend) beside every mla_core prefill backend, one run.

    python benchmarks/bench_prefill.py [--quick] [--all-configs] [--reference] [--cases 4x4096 ...]
                                       [--recipes bf16 fp8 nvfp4] [--backends cuda auto ...]

Cases (causal, heads 128, q/k 192, v 128, bf16 inputs):
  4x4096, 1x16384   equal-length batches (one cu_seqlens tensor for q and k);
  ragged16          16 sequences, lengths log-spaced 128..8192 (33,430 tokens);
  chunk4k+12k       chunked prefill: 4,096 new tokens over a cached prefix of 12,288 (len_q < len_k), timed
                    (a) as one causal call (bottom-right) and (b) as serving engines run it: the prefix in
                    chunks of 8,192 keys (non-causal, with LSE), the new tokens causally over themselves,
                    then merge_attn_states.
Rows: ``sdpa-cudnn`` is torch.nn.functional.scaled_dot_product_attention under
sdpa_kernel(CUDNN_ATTENTION) on the same memory (dense BHSD views; for the ragged batch nested jagged
tensors when torch takes them, else one call per sequence; for the chunk causal_lower_right); every
mla_core backend that accepts the problem (the reference only with --reference: eager, slow) with its
default config (--all-configs: every config; a cudnn row says which of torch's cuDNN ops served it: the
dense one for one sequence or an equal-length batch, else the ragged one); ``auto`` is mla_core's automatic
dispatch (the backend it picked in brackets). Recipes fp8 / nvfp4 quantize Q/K/V/P (only backends that run P quantization).
Times are median µs of CUDA-graph replays with the L2 flushed before each ("timed" says graph), or of
eager calls (Python and launches included: sdpa-cudnn and cudnn always get one such row, and anything a
graph cannot capture is timed so); TFLOP/s counts
2 * (192 + 128) FLOPs per visible (query, key) pair per head; "% mm" is the percentage of the bf16 matmul
rate measured in the same run; "x sdpa" is the time over sdpa-cudnn's for the same case, timed the same
way (graph or eager).
JSON goes to $OUT/bench_prefill.json.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

import mla_core  # noqa: E402
from mla_core import dispatch, numerics, specs  # noqa: E402

HEADS, QK_DIM, V_DIM = 128, 192, 128
RAGGED16 = [round(128 * 64 ** (i / 15)) for i in range(16)]
CASES = {
    "4x4096": [(4096, 4096)] * 4,
    "1x16384": [(16384, 16384)],
    "ragged16": [(n, n) for n in RAGGED16],
    "chunk4k+12k": [(4096, 16384)],
}
ENGINE_CHUNK = 8192
RECIPES = numerics.QUANT_RECIPES


def visible_pairs(seqs) -> int:
    """(query, key) pairs the op's causal rule lets through (bottom-right, len_q <= len_k)."""
    return sum(lq * (lk - lq) + lq * (lq + 1) // 2 for lq, lk in seqs)


def make_inputs(seqs, seed: int = 0):
    """Packed bf16 q/k/v, cu_seqlens (one tensor when every len_q == len_k), max_seqlen_q."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    total_q, total_k = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(total_q, HEADS, QK_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total_k, HEADS, QK_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(total_k, HEADS, V_DIM, device="cuda", dtype=torch.bfloat16, generator=g)

    def cumulative(lengths):
        return torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32,
                            device="cuda")
    cu_q = cumulative([s[0] for s in seqs])
    cu_k = cu_q if all(lq == lk for lq, lk in seqs) else cumulative([s[1] for s in seqs])
    return q, k, v, cu_q, cu_k, max(s[0] for s in seqs)


def recipe_kwargs(recipe: str) -> dict:
    return numerics.recipe_quant(recipe, "prefill")


def sdpa_cudnn(inputs, seqs):
    """(label, fn) running torch SDPA restricted to its cuDNN backend on the same memory."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v, cu_q, cu_k, _ = inputs

    def bhsd(x, batch, length):  # packed [tokens, heads, d] as a strided [batch, heads, length, d] view
        return x.view(batch, length, x.shape[1], x.shape[2]).transpose(1, 2)

    def restricted(fn):
        def run():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return fn()
        return run

    lengths = {s for s in seqs}
    if len(lengths) == 1 and seqs[0][0] == seqs[0][1]:
        batch, length = len(seqs), seqs[0][0]
        args = [bhsd(x, batch, length) for x in (q, k, v)]
        return "dense", restricted(lambda: sdpa(*args, is_causal=True))
    if len(seqs) == 1:
        lq, lk = seqs[0]
        qd, kd, vd = bhsd(q, 1, lq), bhsd(k, 1, lk), bhsd(v, 1, lk)
        bias = causal_lower_right(lq, lk)
        return "causal_lower_right", restricted(lambda: sdpa(qd, kd, vd, attn_mask=bias))
    try:  # nested jagged tensors: one call for the ragged batch
        offsets = cu_q.long()
        nested = [torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2) for x in (q, k, v)]
        fn = restricted(lambda: sdpa(*nested, is_causal=True))
        fn()
        torch.cuda.synchronize()
        return "nested jagged", fn
    except Exception as e:  # noqa: BLE001 (torch says why in the message; we fall back and report it)
        print(f"  sdpa-cudnn: nested jagged tensors refused ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
              "one dense call per sequence instead", flush=True)
    bounds = list(zip(cu_q[:-1].tolist(), cu_q[1:].tolist()))
    views = [[bhsd(x[a:b], 1, b - a) for x in (q, k, v)] for a, b in bounds]
    return "per sequence", restricted(lambda: [sdpa(*args, is_causal=True) for args in views])


def engine_chunked(inputs, seqs, backend: str):
    """The chunked-prefill schedule of serving engines for one sequence (len_q new tokens after a prefix)."""
    q, k, v, _, _, _ = inputs
    (lq, lk), = seqs
    prefix = lk - lq
    cu_q = torch.tensor([0, lq], dtype=torch.int32, device="cuda")
    chunks = []
    for start in range(0, prefix, ENGINE_CHUNK):
        stop = min(prefix, start + ENGINE_CHUNK)
        chunks.append((k[start:stop], v[start:stop], torch.tensor([0, stop - start], dtype=torch.int32, device="cuda")))
    k_new, v_new = k[prefix:], v[prefix:]

    def run():
        out, lse = mla_core.mla_prefill(q, k_new, v_new, cu_q, cu_q, lq, causal=True, return_lse=True, backend=backend)
        for kc, vc, cu_k in chunks:
            o, l = mla_core.mla_prefill(q, kc, vc, cu_q, cu_k, lq, causal=False, return_lse=True, backend=backend)
            out, lse = mla_core.merge_attn_states(o, l, out, lse)
        return out
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--all-configs", action="store_true", help="time every config of every backend, not only the default")
    ap.add_argument("--reference", action="store_true", help="also time the reference backend (eager; slow)")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--backends", nargs="*", default=None,
                    help="mla_core backends to time, 'auto' for the dispatch row (default: all; sdpa-cudnn always)")
    args = ap.parse_args()
    wanted = (lambda name: True) if args.backends is None else (lambda name: name in args.backends)
    os.environ.setdefault("MLA_CORE_CHECKS", "metadata")  # no host reads of cu_seqlens inside timed calls

    ceilings = measure_ceilings()
    print(f"ceilings: bf16 matmul {ceilings['bf16_tflops']:.0f} TFLOP/s, copy {ceilings['copy_gbps']:.0f} GB/s; "
          f"cuDNN {torch.backends.cudnn.version()}", flush=True)
    iters = 10 if args.quick else 30
    rows = []

    def record(case, recipe, backend, config, fn, flops, graph=True):
        """Time ``fn`` in a CUDA graph (eagerly when it cannot be captured, or when ``graph`` is False)."""
        us, mode = None, "graph"
        if graph:
            try:
                us = time_graph(fn, iters=iters)
            except Exception as e:  # noqa: BLE001 (reported; timed eagerly instead)
                torch.cuda.synchronize()
                print(f"  {case} {recipe} {backend}: no CUDA graph ({type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0][:160]}); timing eagerly", flush=True)
        if us is None:
            mode = "eager"
            try:
                us = time_eager(fn, iters=max(5, iters // 3), warmup=2)
            except Exception as e:  # noqa: BLE001 (a backend that fails here is reported, the others still run)
                print(f"  {case} {recipe} {backend}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                      flush=True)
                torch.cuda.synchronize()
                return None
        row = dict(case=case, recipe=recipe, backend=backend, config=config, us=us, tflops=flops / us / 1e6,
                   mode=mode)
        row["pct_mm"] = 100 * row["tflops"] / ceilings["bf16_tflops"]
        rows.append(row)
        print(f"  {case} {recipe} {backend} {config}: {us:.0f} µs ({mode}), {row['tflops']:.1f} TFLOP/s", flush=True)
        return row

    for case in args.cases:
        seqs = CASES[case]
        inputs = make_inputs(seqs)
        flops = 2 * (QK_DIM + V_DIM) * visible_pairs(seqs) * HEADS
        for recipe in args.recipes:
            kw = recipe_kwargs(recipe)
            problem, call = specs.validate_prefill(
                *inputs, None, True, False, q_amax=None, k_amax=None, p_amax=1.0, v_amax=None, sparsity_n=0,
                sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64, **kw)
            if recipe == "bf16":
                label, fn = sdpa_cudnn(inputs, seqs)
                record(case, recipe, "sdpa-cudnn", label, fn, flops)
                record(case, recipe, "sdpa-cudnn", label, fn, flops, graph=False)  # Python and launch costs included
                cudnn = mla_core.get_backend("cudnn")
                if wanted("cudnn") and not cudnn.why_not(problem) and cudnn.capture_reason(problem) is None:
                    # (else its row below is eager)
                    record(case, recipe, "cudnn", "dense op" if cudnn.serves_dense(problem) else "ragged op",
                           lambda: mla_core.mla_prefill(*inputs, causal=True, backend="cudnn"), flops, graph=False)
            for name, backend in sorted(mla_core.backends().items()):
                if backend.why_not(problem) or (name == "reference" and not args.reference) or not wanted(name):
                    continue
                configs = backend.configs(problem) if args.all_configs else backend.configs(problem)[:1]
                for config in configs:
                    label = ",".join(f"{k}={v}" for k, v in config.items()) or "-"
                    if name == "cudnn":  # which of torch's two cuDNN ops serves the problem
                        label = "dense op" if backend.serves_dense(problem) else "ragged op"
                    capturable = name != "reference" and not (name == "cudnn" and backend.capture_reason(problem))
                    record(case, recipe, name, label, lambda b=backend, c=config: b.run(problem, call, c), flops,
                           graph=capturable)
            if wanted("auto"):
                picked = dispatch.choose(problem).backend.name
                record(case, recipe, "auto", f"[{picked}]", lambda: mla_core.mla_prefill(*inputs, causal=True, **kw),
                       flops)
            if case.startswith("chunk") and recipe == "bf16":
                for name in ("cudnn", "triton"):
                    if wanted(name) and not mla_core.get_backend(name).why_not(problem):
                        record(case, recipe, f"{name} engine", f"prefix chunks {ENGINE_CHUNK} + merge",
                               engine_chunked(inputs, seqs, name), flops)
            both = wanted("cudnn") and wanted("triton")
            if recipe == "bf16" and both and not mla_core.get_backend("cudnn").why_not(problem):
                # the same function: the cuDNN path against SDPA (or, for the chunk, the triton backend)
                ours = mla_core.mla_prefill(*inputs, causal=True, backend="cudnn").float()
                other = mla_core.mla_prefill(*inputs, causal=True, backend="triton").float()
                err = ((ours - other).norm() / other.norm()).item()
                print(f"  {case}: cudnn backend vs triton backend rel-L2 {err:.2e}", flush=True)
            torch.cuda.empty_cache()
        del inputs
        torch.cuda.empty_cache()

    base = {(r["case"], r["mode"]): r["us"] for r in rows if r["backend"] == "sdpa-cudnn"}
    for r in rows:  # graph rows against SDPA in a graph, eager rows against SDPA called eagerly
        if (r["case"], r["mode"]) in base:
            r["x_sdpa"] = r["us"] / base[(r["case"], r["mode"])]
    print()
    print_table(rows, COLUMNS)
    path = write_json("bench_prefill.json", {"device": device_info(), "ceilings": ceilings, "rows": rows,
                                             "cases": {c: CASES[c] for c in args.cases}})
    if path:
        print(f"wrote {path}")


COLUMNS = [("case", "case", "s"), ("recipe", "recipe", "s"), ("backend", "backend", "s"), ("config", "config", "s"),
           ("mode", "timed", "s"), ("us", "µs", ".0f"), ("tflops", "TFLOP/s", ".1f"), ("pct_mm", "% mm", ".1f"), ("x_sdpa", "x sdpa", ".2f")]

if __name__ == "__main__":
    main()
