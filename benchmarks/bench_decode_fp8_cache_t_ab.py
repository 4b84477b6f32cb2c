"""A/B of two builds of the cuda decode over bf16 and FP8 KV caches (issue 9; first used for the keys-as-M kernel,
csrc/mla_decode_wgmma.cu's decode_t_kernel at <= 16 heads): one process, the same inputs, builds A (main's csrc/)
and B (a branch's), timed alternately.

    python benchmarks/bench_decode_fp8_cache_t_ab.py --src-a DIR_A --src-b DIR_B [--heads 16,128]
        [--batch 1,32,128] [--lengths 8192,32768] [--q-dtype bf16]

Rows: heads x batch x length, page 64, full lengths, ``num_kv_splits="auto"``, the config dispatch lists first.
Per row: the bf16 cache and the FP8 cache (float8_e4m3fn codes of the same values, kv_scale = amax / 448) on A and
B, in the order A B FA FB FB FA B A; µs are CUDA-graph replays with L2 flushed, the median per (build, cache).
Checks: B's bf16 outputs and LSE bit-equal to A's; B's FP8-cache outputs bit-equal to A's above 16 heads, within
1e-2 rel L2 (output) / 1e-4 (LSE) of A's at <= 16 heads (where a change of the keys-as-M kernel may reorder sums;
the tests hold it to the reference). Bit-equality is what a pure speed change must keep. JSON to
$OUT/bench_decode_fp8_cache_t_ab.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import fp8_cache, make_inputs  # noqa: E402
from common import device_info, print_table, same_bits, time_graph, write_json  # noqa: E402
from common import load_cuda_extension as load  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core.accuracy import rel_l2  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE = 512, 64


def problem_call(q, cache, table, lens, kv_scale=None):
    """(problem, call) of an unquantized decode, auto splits, LSE returned; ``kv_scale`` for an FP8 cache."""
    return validate_decode(q, cache, table, lens, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                           qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None,
                           v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                           kv_scale=kv_scale)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-a", required=True)
    ap.add_argument("--src-b", required=True)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--q-dtype", default="bf16", choices=("bf16", "fp16"))
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    from mla_core_cuda import decode
    mods = {"A": load(args.src_a), "B": load(args.src_b)}
    cuda = mla_core.get_backend("cuda")
    print(f"# {device_info()}\n# A = {args.src_a} ({mods['A'].__name__}), B = {args.src_b} ({mods['B'].__name__}); "
          f"q {args.q_dtype}", flush=True)
    rows, bad = [], []
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
                f_problem, f_call = problem_call(q, codes, table, lens, kv_scale)
                f_config = cuda.configs(f_problem)[0]
                outs = {n: decode.run(m, call, config) for n, m in mods.items()}
                f_outs = {n: decode.run(m, f_call, f_config) for n, m in mods.items()}
                r["bf16_bitequal"] = all(same_bits(a, b) for a, b in zip(outs["A"], outs["B"]))
                r["fp8_bitequal"] = all(same_bits(a, b) for a, b in zip(f_outs["A"], f_outs["B"]))
                r["fp8_rel_l2"] = rel_l2(f_outs["B"][0], f_outs["A"][0])
                r["fp8_lse_rel_l2"] = rel_l2(f_outs["B"][1], f_outs["A"][1])
                ok = r["bf16_bitequal"] and (r["fp8_bitequal"] if heads > 16 else
                                             r["fp8_rel_l2"] < 1e-2 and r["fp8_lse_rel_l2"] < 1e-4)
                if not ok:
                    bad.append(r)
                times = {k: [] for k in ("A", "B", "FA", "FB")}
                for name in ("A", "B", "FA", "FB", "FB", "FA", "B", "A"):
                    mod = mods[name[-1]]
                    c, cf = (f_call, f_config) if name.startswith("F") else (call, config)
                    times[name].append(time_graph(lambda mod=mod, c=c, cf=cf: decode.run(mod, c, cf), iters=20))
                r["bf16_A"], r["bf16_B"], r["fp8_A"], r["fp8_B"] = (statistics.median(times[k])
                                                                    for k in ("A", "B", "FA", "FB"))
                r["splits"] = decode.num_splits(call, config)
                r["fp8_B_over_bf16_B"] = r["fp8_B"] / r["bf16_B"]
                r["fp8_A_over_bf16_A"] = r["fp8_A"] / r["bf16_A"]
                r["fp8_B_over_A"] = r["fp8_B"] / r["fp8_A"]
                rows.append(r)
                print(f"H={heads} B={batch} L={length} (splits {r['splits']}): bf16 A {r['bf16_A']:.1f} B "
                      f"{r['bf16_B']:.1f} us; fp8 cache A {r['fp8_A']:.1f} B {r['fp8_B']:.1f} us; fp8 B / bf16 B "
                      f"{r['fp8_B_over_bf16_B']:.3f}; bf16 B == A {r['bf16_bitequal']}; fp8 B == A "
                      f"{r['fp8_bitequal']} (rel L2 {r['fp8_rel_l2']:.1e}, LSE {r['fp8_lse_rel_l2']:.1e})"
                      + ("" if ok else "  <-- CHECK FAILED"), flush=True)
                del q, cache, codes, table, lens, outs, f_outs, f_call, call
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"), ("splits", "splits", "d"),
                       ("bf16_A", "bf16 A", ".1f"), ("bf16_B", "bf16 B", ".1f"), ("fp8_A", "fp8 A", ".1f"),
                       ("fp8_B", "fp8 B", ".1f"), ("fp8_A_over_bf16_A", "fp8/bf16 A", ".3f"),
                       ("fp8_B_over_bf16_B", "fp8/bf16 B", ".3f"), ("fp8_B_over_A", "fp8 B/A", ".3f")])
    print(f"rows passing the equality checks: {len(rows) - len(bad)} of {len(rows)}")
    write_json("bench_decode_fp8_cache_t_ab.json", dict(device=device_info(), src_a=args.src_a, src_b=args.src_b,
                                                        q_dtype=args.q_dtype, rows=rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
