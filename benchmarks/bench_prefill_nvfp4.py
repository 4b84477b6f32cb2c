"""The nvfp4 recipe's prefill on cuda (round (m), branch wip/nvfp4: the NVFP4 pre-pass + the bf16-wgmma kernel with
P's NVFP4 in registers) beside cuDNN SDPA (bf16), the cuda bf16 and fp8 paths and triton's nvfp4, one process, the
same inputs.

    python benchmarks/bench_prefill_nvfp4.py [--cases 4x4096 1x16384 ragged16] [--rounds 3] [--ref-heads 8]

Cases as bench_prefill.py (causal, 128 heads, q/k 192, v 128, randn inputs); the quantized recipes with calibrated
amaxes (q 4.5, k 5.0, v 4.25, p 1.0). Per case, in CUDA-graph replays with the L2 flushed (median µs of 10), each
round in one order and the next reversed: ``sdpa-cudnn`` (bf16, bench_prefill's views; eager where a graph cannot
hold it), ``cuda bf16``, ``cuda fp8`` (the fp8 recipe's default config, FP8 wgmma), ``triton nvfp4`` (its default
config) and ``cuda nvfp4`` (config ``{}``: pre-pass + kernel); then the nvfp4 pre-pass alone (Q + K along features,
V along keys). TFLOP/s counts 2 · (192 + 128) FLOPs per visible pair per head; ``x cudnn`` is the time over
sdpa-cudnn's.

Accuracy against the reference backend on the first ``--ref-heads`` heads (heads are independent: the amaxes are
given, V's blocks run along keys), for cuda nvfp4 and triton nvfp4: out rel-L2 and max |ΔLSE| / max |LSE|. The gate
(exit 1 when cuda nvfp4 misses it): rel-L2 < 1e-2 and |ΔLSE| <= 1e-4 + numerics.FP8_MMA_LSE_RTOL · max|LSE| (the
fp8 path's tolerance); whether it also meets the bf16 kernels' exact bound (1e-5 · max|LSE|) is printed. JSON to
$OUT/bench_prefill_nvfp4.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import CASES, HEADS, QK_DIM, V_DIM, make_inputs, sdpa_cudnn, visible_pairs  # noqa: E402
from common import device_info, load_cuda_extension, print_table, timed, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")

import mla_core  # noqa: E402
from mla_core import numerics, specs  # noqa: E402
from mla_core_cuda import prefill as cuda_prefill  # noqa: E402

AMAX = dict(q_amax=4.5, k_amax=5.0, v_amax=4.25, p_amax=1.0)
EXACT_LSE_RTOL = 1e-5
"""The bf16 kernels' LSE bound (tests/test_cuda_prefill.py LSE_RTOL), printed beside the gate."""


def call_for(inputs, fmt, **amax):
    return specs.validate_prefill(
        *inputs, None, True, True, q_quant=fmt, k_quant=fmt, p_quant=fmt, v_quant=fmt, sparsity_n=0, sparsity_m=4,
        dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64, **amax)


def accuracy(out, lse, ref_out, ref_lse, heads: int) -> dict:
    """out rel-L2 and LSE errors of (out, lse) on the first ``heads`` heads against the reference's."""
    o = out[:, :heads].float()
    err = ((o - ref_out.float()).norm() / ref_out.float().norm()).item()
    ll = lse[:heads]
    finite = torch.isfinite(ref_lse)
    lse_max = ref_lse[finite].abs().max().item()
    dlse = (ll[finite] - ref_lse[finite]).abs().max().item()
    same_inf = bool(torch.equal(ll[~finite], ref_lse[~finite]))
    return dict(err=err, dlse=dlse, lse_max=lse_max, same_inf=same_inf,
                gate=err < 1e-2 and same_inf and dlse <= 1e-4 + numerics.FP8_MMA_LSE_RTOL * lse_max,
                exact=err < 1e-2 and same_inf and dlse <= 1e-4 + EXACT_LSE_RTOL * lse_max)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=["4x4096", "1x16384", "ragged16"], choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ref-heads", type=int, default=8)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    module = load_cuda_extension(os.path.join(here, "..", "csrc"))
    triton = mla_core.get_backend("triton")
    print(f"# {device_info()}\n# cuda extension {module.__name__}", flush=True)
    rows, failures = [], 0
    for case in args.cases:
        seqs = CASES[case]
        inputs = make_inputs(seqs)
        flops = 2 * (QK_DIM + V_DIM) * visible_pairs(seqs) * HEADS
        _, call_bf16 = call_for(inputs, None, q_amax=None, k_amax=None, v_amax=None, p_amax=1.0)
        _, call_fp8 = call_for(inputs, "fp8", **AMAX)
        problem_nv, call_nv = call_for(inputs, "nvfp4", **AMAX)
        fp8_config = cuda_prefill.configs(dict(q_quant="fp8", k_quant="fp8", v_quant="fp8", p_quant="fp8"))[0]
        triton_config = triton.configs(problem_nv)[0]
        label, cudnn_fn = sdpa_cudnn(inputs, seqs)
        fns = {f"sdpa-cudnn ({label})": cudnn_fn,
               "cuda bf16": lambda: cuda_prefill.run(module, call_bf16, {}),
               f"cuda fp8 {fp8_config}": lambda: cuda_prefill.run(module, call_fp8, fp8_config),
               "triton nvfp4": lambda: triton.run(problem_nv, call_nv, triton_config),
               "cuda nvfp4": lambda: cuda_prefill.run(module, call_nv, {})}
        # accuracy on the first ref_heads heads against the reference backend
        h = min(args.ref_heads, HEADS)
        sub = [x[:, :h] for x in inputs[:3]] + list(inputs[3:])
        ref_out, ref_lse = mla_core.mla_prefill(*sub, causal=True, return_lse=True, backend="reference",
                                                q_quant="nvfp4", k_quant="nvfp4", v_quant="nvfp4", p_quant="nvfp4",
                                                **AMAX)
        acc = {}
        for name in ("cuda nvfp4", "triton nvfp4"):
            out, lse = fns[name]()
            acc[name] = accuracy(out, lse, ref_out, ref_lse, h)
            a = acc[name]
            print(f"{case}: {name} vs reference ({h} heads): out rel-L2 {a['err']:.2e}, max |dLSE| {a['dlse']:.2e} "
                  f"(max |LSE| {a['lse_max']:.1f}; gate {1e-4 + numerics.FP8_MMA_LSE_RTOL * a['lse_max']:.2e}: "
                  f"{'ok' if a['gate'] else 'FAIL'}; exact bound {1e-4 + EXACT_LSE_RTOL * a['lse_max']:.2e}: "
                  f"{'met' if a['exact'] else 'missed'})", flush=True)
            del out, lse
        failures += not acc["cuda nvfp4"]["gate"]
        del ref_out, ref_lse, sub
        torch.cuda.empty_cache()
        times = {name: [] for name in fns}
        modes = {}
        for rnd in range(args.rounds):
            for name in (list(fns) if rnd % 2 == 0 else list(fns)[::-1]):
                us, modes[name] = timed(fns[name], f"{case} {name}")
                times[name].append(us)
        cu_k = call_nv.cu_seqlens_k.to(torch.int32)

        def prepass():
            cuda_prefill.nvfp4_rows(module, [(call_nv.q, AMAX["q_amax"]), (call_nv.k, AMAX["k_amax"])])
            return cuda_prefill.nvfp4_keys(module, call_nv.v, cu_k, AMAX["v_amax"])
        pre_us = statistics.median(timed(prepass, f"{case} pre-pass")[0] for _ in range(args.rounds))
        cudnn_us = statistics.median(times[f"sdpa-cudnn ({label})"])
        base = {k: statistics.median(v) for k, v in times.items()}
        for name, ts in times.items():
            us = base[name]
            row = dict(case=case, path=name, mode=modes[name], us=us, tflops=flops / us / 1e6, x_cudnn=us / cudnn_us,
                       spread=max(ts) / min(ts) - 1)
            if name in acc:
                row.update(err=acc[name]["err"], dlse_rel=acc[name]["dlse"] / acc[name]["lse_max"])
            if name == "cuda nvfp4":
                row["x_triton"] = us / base["triton nvfp4"]
                row["x_cuda_bf16"] = us / base["cuda bf16"]
            rows.append(row)
            print(f"  {case} {name}: {us:.0f} µs ({modes[name]}), {flops / us / 1e6:.0f} TFLOP/s, "
                  f"{us / cudnn_us:.3f} x cudnn; rounds {[round(t) for t in ts]}", flush=True)
        rows.append(dict(case=case, path="pre-pass: nvfp4 Q+K, V", mode="graph", us=pre_us,
                         x_cudnn=pre_us / cudnn_us))
        print(f"  {case} nvfp4 pre-pass alone: {pre_us:.0f} µs", flush=True)
        del fns, call_bf16, call_fp8, call_nv, inputs
        torch.cuda.empty_cache()
    print()
    print_table(rows, COLUMNS)
    print(f"\nsummary: {len(rows)} rows, {failures} failed accuracy gates (cuda nvfp4 against the reference)")
    write_json("bench_prefill_nvfp4.json", {"device": device_info(), "rows": rows, "amax": AMAX})
    if failures:
        raise SystemExit(1)


COLUMNS = [("case", "case", "s"), ("path", "path", "s"), ("mode", "mode", "s"), ("us", "µs", ".0f"),
           ("tflops", "TFLOP/s", ".0f"), ("x_cudnn", "x cudnn", ".3f"), ("x_triton", "x triton", ".3f"),
           ("x_cuda_bf16", "x cuda bf16", ".3f"), ("err", "rel-L2 vs ref", ".2e"), ("dlse_rel", "dLSE/|LSE|", ".1e"),
           ("spread", "max spread", ".3f")]

if __name__ == "__main__":
    main()
