"""A/B of the cuda decode over a bf16 / fp16 cache at <= 16 heads (issue 9, round (l)): A = main's csrc/ under the
default WGMMA config (schedule Q1 of decode_wgmma_kernel), B = a branch's csrc/ under the keys-as-M config
({"kernel": "keys_m"}, decode_km_kernel); one process, the same inputs, timed alternately.

    python benchmarks/bench_decode_keys_m_bf16_ab.py --src-a DIR_A --src-b DIR_B [--heads 16] [--batch 1,32,128]
        [--lengths 8192,32768] [--q-dtype bf16]

Rows: heads x batch x length, page 64, full lengths, ``num_kv_splits="auto"`` (both configs: one CTA per SM, the
same split count). µs are CUDA-graph replays with L2 flushed, in the order A B B A A B, the median per build; the
FP8 cache of the same values (decode_t_kernel, whose end moved into km_merge) on A and B alike, FA FB FB FA.
Checks: B's default config (Q1) bit-equal to A's (the shared code moved, Q1 untouched) for the bf16 cache and the FP8
cache (decode_t_kernel's end now km_merge); B's keys-as-M output against A's Q1 output: rel L2, max |diff| and LSE
max |diff| (not bit-equal: P against a per-step max, other sum orders; must stay below 1e-2 / 1e-3). FlashMLA's H200
µs (issue 9's table, bf16 H16) where known. JSON to $OUT/bench_decode_keys_m_bf16_ab.json.
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
FLASHMLA_US = {(16, 32, 8192): 95.3, (16, 32, 32768): 318.0, (16, 128, 8192): 316.7, (16, 128, 32768): 1177.8}
"""FlashMLA's bf16 decode on the H200 (µs; issue 9's target: cuda <= 1.02x at batch >= 32)."""


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
    ap.add_argument("--heads", default="16")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--q-dtype", default="bf16", choices=("bf16", "fp16"))
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    from mla_core_cuda import decode
    mods = {"A": load(args.src_a), "B": load(args.src_b)}
    cuda = mla_core.get_backend("cuda")
    print(f"# {device_info()}\n# A = {args.src_a} ({mods['A'].__name__}) Q1, B = {args.src_b} "
          f"({mods['B'].__name__}) keys_m; q {args.q_dtype}", flush=True)
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
                assert config == decode.WGMMA and decode.keys_m_covers(problem), (config, problem)
                f_call = problem_call(q, codes, table, lens, kv_scale)[1]
                q1 = {n: decode.run(m, call, config) for n, m in mods.items()}
                fp8 = {n: decode.run(m, f_call, config) for n, m in mods.items()}
                out, lse = decode.run(mods["B"], call, decode.KEYS_M)
                want, want_lse = q1["A"]
                r["q1_bitequal"] = all(same_bits(a, b) for a, b in zip(q1["A"], q1["B"]))
                r["fp8_bitequal"] = all(same_bits(a, b) for a, b in zip(fp8["A"], fp8["B"]))
                r["rel_l2"] = rel_l2(out, want)
                r["max_diff"] = (out.float() - want.float()).abs().max().item()
                r["lse_diff"] = (lse - want_lse).abs().max().item()
                r["bitequal"] = same_bits(out, want) and same_bits(lse, want_lse)
                ok = (r["q1_bitequal"] and r["fp8_bitequal"] and not torch.isnan(out).any().item()
                      and r["rel_l2"] < 1e-2 and r["lse_diff"] < 1e-3)
                if not ok:
                    bad.append(r)
                times = {"A": [], "B": [], "FA": [], "FB": []}
                for name in ("A", "B", "B", "A", "A", "B", "FA", "FB", "FB", "FA"):
                    mod = mods[name[-1]]
                    c, cf = (f_call, config) if name[0] == "F" else (call, config if name == "A" else decode.KEYS_M)
                    times[name].append(time_graph(lambda mod=mod, c=c, cf=cf: decode.run(mod, c, cf), iters=20))
                r["A"], r["B"], r["fp8_A"], r["fp8_B"] = (statistics.median(times[k]) for k in ("A", "B", "FA", "FB"))
                r["B_over_A"] = r["B"] / r["A"]
                r["fp8_B_over_A"] = r["fp8_B"] / r["fp8_A"]
                r["splits"] = decode.num_splits(call, config)
                r["splits_B"] = decode.num_splits(call, decode.KEYS_M)
                fm = FLASHMLA_US.get((heads, batch, length)) if args.q_dtype == "bf16" else None
                r["A_over_flashmla"] = r["A"] / fm if fm else None
                r["B_over_flashmla"] = r["B"] / fm if fm else None
                gb = batch * length * (RANK + ROPE) * cache.element_size() / 1e9
                r["B_TBps"] = gb / r["B"] * 1e3
                rows.append(r)
                print(f"H={heads} B={batch} L={length} (splits {r['splits']}/{r['splits_B']}): A {r['A']:.1f} B "
                      f"{r['B']:.1f} us, B/A {r['B_over_A']:.3f}"
                      + (f", vs FlashMLA A {r['A_over_flashmla']:.3f} B {r['B_over_flashmla']:.3f}" if fm else "")
                      + f"; B {r['B_TBps']:.2f} TB/s; keys_m vs Q1: bit-equal {r['bitequal']}, rel L2 "
                      f"{r['rel_l2']:.1e}, max diff {r['max_diff']:.1e}, LSE {r['lse_diff']:.1e}; Q1 B == A "
                      f"{r['q1_bitequal']}, FP8 cache B == A {r['fp8_bitequal']} (B/A {r['fp8_B_over_A']:.3f})"
                      + ("" if ok else "  <-- CHECK FAILED"),
                      flush=True)
                del q, cache, codes, table, lens, q1, fp8, out, lse, want, want_lse, call, f_call
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"), ("splits", "splits", "d"),
                       ("A", "A us", ".1f"), ("B", "B us", ".1f"), ("B_over_A", "B/A", ".3f"),
                       ("A_over_flashmla", "A/FlashMLA", ".3f"), ("B_over_flashmla", "B/FlashMLA", ".3f"),
                       ("B_TBps", "B TB/s", ".2f"), ("rel_l2", "rel L2", ".1e"), ("max_diff", "max diff", ".1e"),
                       ("fp8_B_over_A", "fp8 B/A", ".3f")])
    print(f"rows passing the checks: {len(rows) - len(bad)} of {len(rows)}")
    write_json("bench_decode_keys_m_bf16_ab.json", dict(device=device_info(), src_a=args.src_a, src_b=args.src_b,
                                                        q_dtype=args.q_dtype, rows=rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
