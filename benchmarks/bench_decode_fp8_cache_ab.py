"""A/B of the FP8 KV cache on the cuda WGMMA decode (issue 9, branch wip/decode-wgmma-fp8-cache): one process, the
same inputs, builds A (main's csrc/, bf16 cache only) and B (this branch's) timed alternately.

    python benchmarks/bench_decode_fp8_cache_ab.py --src-a DIR_A --src-b DIR_B [--heads 16,128] [--batch 1,32,128]
        [--lengths 8192,32768] [--q-dtype bf16] [--triton]

DIR_A / DIR_B: csrc/ folders (build both beforehand: benchmarks/run_decode_fp8_cache_ab.sh does). Rows: heads x
batch x length, page 64, full lengths, ``num_kv_splits="auto"``, the config dispatch lists first (the WGMMA
kernel). Per row: the bf16 cache on A and B (A B F B F A), the FP8 cache (F: float8_e4m3fn codes of the same
values, kv_scale = amax / 448) on B, and with --triton the triton backend's FP8 cache once (its first config);
µs are CUDA-graph replays with L2 flushed, the median per build. B's bf16 outputs and LSE must equal A's bit for
bit (the unquantized instances' PTX is unchanged); B's FP8-cache output is compared with B's bf16 output on the
dequantized values' bf16 cache (rel L2: the FP8 rounding of the values, ~2-3 %, a sanity bound only). JSON to
$OUT/bench_decode_fp8_cache_ab.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import fp8_cache, make_inputs  # noqa: E402
from common import device_info, load_cuda_extension, print_table, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE = 512, 64


def problem_call(q, cache, table, lens, kv_scale=None):
    return validate_decode(q, cache, table, lens, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                           qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None,
                           v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                           kv_scale=kv_scale)


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-a", required=True)
    ap.add_argument("--src-b", required=True)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--q-dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--triton", action="store_true", help="also time triton's FP8 cache (compiles on first use)")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    from mla_core_cuda import decode
    mods = {"A": load_cuda_extension(args.src_a), "B": load_cuda_extension(args.src_b)}
    cuda, triton = mla_core.get_backend("cuda"), mla_core.get_backend("triton") if args.triton else None
    print(f"# {device_info()}\n# A = {args.src_a} ({mods['A'].__name__}), B = {args.src_b} ({mods['B'].__name__}); "
          f"q {args.q_dtype}", flush=True)
    rows, mismatches = [], 0
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for length in ints(args.lengths):
                q, cache, table, lens = make_inputs(batch, heads, length)
                codes, kv_scale = fp8_cache(cache)
                if args.q_dtype == "fp16":
                    q, cache = q.half(), cache.half()
                r = dict(heads=heads, batch=batch, length=length)
                problem, call = problem_call(q, cache, table, lens)
                config = cuda.configs(problem)[0]
                outs = {name: decode.run(mod, call, config) for name, mod in mods.items()}
                same = all(torch.equal(bits(a), bits(b)) for a, b in zip(outs["A"], outs["B"]))
                mismatches += not same
                f_problem, f_call = problem_call(q, codes, table, lens, kv_scale)
                f_config = cuda.configs(f_problem)[0]
                f_out, _ = decode.run(mods["B"], f_call, f_config)
                # the bf16 cache of the FP8 cache's values (the value the contract dequantizes to, rounded to bf16)
                deq = (codes.float() * kv_scale).to(q.dtype)
                _, d_call = problem_call(q, deq, table, lens)
                d_out, _ = decode.run(mods["B"], d_call, config)
                r["fp8_vs_deq_rel_l2"] = ((f_out.double() - d_out.double()).norm() / d_out.double().norm()).item()
                del deq, d_out, d_call
                times = {"A": [], "B": [], "F": []}
                for name in ("A", "B", "F", "B", "F", "A"):
                    if name == "F":
                        times[name].append(time_graph(lambda: decode.run(mods["B"], f_call, f_config), iters=20))
                    else:
                        mod = mods[name]
                        times[name].append(time_graph(lambda mod=mod: decode.run(mod, call, config), iters=20))
                r["bf16_A"], r["bf16_B"], r["fp8_B"] = (statistics.median(times[k]) for k in ("A", "B", "F"))
                r["splits"] = decode.num_splits(call, config)
                r["fp8_over_bf16"] = r["fp8_B"] / r["bf16_B"]
                r["bf16_bitequal"] = same
                if triton is not None:
                    t_config = triton.configs(f_problem)[0]
                    triton.decode(f_call, t_config)  # compile outside the timing
                    r["triton_fp8"] = time_graph(lambda: triton.decode(f_call, t_config), iters=20)
                    r["triton_over_cuda_fp8"] = r["triton_fp8"] / r["fp8_B"]
                rows.append(r)
                print(f"H={heads} B={batch} L={length} (splits {r['splits']}): bf16 A {r['bf16_A']:.1f} B "
                      f"{r['bf16_B']:.1f} us; fp8 cache B {r['fp8_B']:.1f} us = {r['fp8_over_bf16']:.3f} x bf16"
                      + (f"; triton fp8 cache {r['triton_fp8']:.1f} us" if triton is not None else "")
                      + f"; bf16 B == A: {same}; fp8 vs dequantized rel L2 {r['fp8_vs_deq_rel_l2']:.2e}", flush=True)
                del q, cache, codes, table, lens, outs, f_out, f_call, call
                torch.cuda.empty_cache()
    print()
    cols = [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"), ("splits", "splits", "d"),
            ("bf16_A", "bf16 A", ".1f"), ("bf16_B", "bf16 B", ".1f"), ("fp8_B", "fp8 cache B", ".1f"),
            ("fp8_over_bf16", "fp8 / bf16", ".3f")]
    if triton is not None:
        cols += [("triton_fp8", "triton fp8", ".1f"), ("triton_over_cuda_fp8", "triton / cuda fp8", ".2f")]
    print_table(rows, cols)
    print(f"bf16 outputs and LSE of B bit-equal to A's: {len(rows) - mismatches} of {len(rows)}")
    bad = [r for r in rows if not r["fp8_vs_deq_rel_l2"] < 0.05]
    print(f"fp8-cache outputs within 5 % rel L2 of the dequantized bf16 cache's: {len(rows) - len(bad)} of {len(rows)}")
    write_json("bench_decode_fp8_cache_ab.json", dict(device=device_info(), src_a=args.src_a, src_b=args.src_b,
                                                      q_dtype=args.q_dtype, rows=rows))
    return 1 if mismatches or bad else 0


if __name__ == "__main__":
    sys.exit(main())
