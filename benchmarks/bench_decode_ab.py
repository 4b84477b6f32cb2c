"""A/B of two builds (and configs) of the cuda decode (issue 9): one process, the same inputs, A and B timed
alternately (A B B A A B), so clock and run-to-run drift fall on both alike.

    python benchmarks/bench_decode_ab.py --src-a DIR_A --src-b DIR_B [--cases bf16,fp8_cache]
        [--config-b bf16='{"kernel": "keys_m"}'] [--config-a CASE=JSON] [--allow-diff bf16]
        [--heads 16,128] [--batch 1,32,128] [--lengths 8192,32768] [--q-dtype bf16|fp16] [--name TAG]

DIR_A / DIR_B: csrc/ folders, each built into the build cache under its own key (build both first to keep compile
time out of the timed call: benchmarks/run_decode_ab.sh does). Cases, per shape (page 64, full lengths,
``num_kv_splits="auto"``, LSE returned):

* ``bf16``: the unquantized decode over the bf16 (or ``--q-dtype fp16``: fp16) cache;
* ``fp8_cache``: the FP8 KV cache of the same values (float8_e4m3fn codes, ``kv_scale = amax / 448``);
* ``fp8`` / ``nvfp4``: the recipe (K, V and P fake-quantized, numerics.recipe_quant) over the 16-bit cache;
* ``fp8_p_nvfp4``: K and V FP8 (one scale: the WGMMA kernel's shared codes), P NVFP4, over the 16-bit cache.

Each case runs config A (``--config-a CASE=JSON``, else the first of the backend's configs: what dispatch runs
untuned) on build A and config B (``--config-b``, else the same default) on build B. µs are CUDA-graph replays with
the L2 flushed, the median per side. Checks: B's output and LSE bit-equal to A's (what a pure speed change keeps),
except in the ``--allow-diff`` cases, where B must stay within rel L2 1e-2 of A's output and 1e-3 of its LSE (max
|diff|): a kernel that sums in another order. FlashMLA's bf16 µs on the H200 (bench_decode.FLASHMLA_US) where
known. Exit status 1 if a check failed. JSON to $OUT/bench_decode_ab[_TAG].json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import FLASHMLA_US, fp8_cache, make_inputs  # noqa: E402
from common import device_info, load_cuda_extension, print_table, same_bits, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core import numerics  # noqa: E402
from mla_core.accuracy import rel_l2  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE = 512, 64
CASES = ("bf16", "fp8_cache", "fp8", "nvfp4", "fp8_p_nvfp4")
ORDER = ("A", "B", "B", "A", "A", "B")


def case_call(case, q, cache, codes, kv_scale, table, lens):
    """(problem, call) of one case: unquantized over the 16-bit cache, over the FP8 cache, or a quant recipe."""
    quant = (dict(k_qdq="fp8", v_qdq="fp8", p_qdq="nvfp4") if case == "fp8_p_nvfp4" else
             numerics.recipe_quant(case if case in ("fp8", "nvfp4") else "bf16", "decode"))
    fp8 = case == "fp8_cache"
    return validate_decode(q, codes if fp8 else cache, table, lens, softmax_scale=(RANK + ROPE) ** -0.5,
                           kv_lora_rank=RANK, qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto",
                           k_qdq_amax=None, v_qdq_amax=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                           kv_scale=kv_scale if fp8 else None, **quant)


def per_case(values, what):
    """``CASE=JSON`` arguments -> {case: config}."""
    out = {}
    for item in values or ():
        case, _, text = item.partition("=")
        if case not in CASES or not text:
            raise SystemExit(f"{what}: {item!r} is not CASE=JSON with CASE one of {', '.join(CASES)}")
        out[case] = json.loads(text)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-a", required=True)
    ap.add_argument("--src-b", required=True)
    ap.add_argument("--cases", default="bf16", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--config-a", action="append", help="CASE=JSON: A's config in that case (default: the first)")
    ap.add_argument("--config-b", action="append", help="CASE=JSON: B's config in that case (default: the first)")
    ap.add_argument("--allow-diff", default="", help="cases where B may differ from A within 1e-2 / 1e-3")
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--q-dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--name", default="", help="tag of the JSON file name")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    cases = [c for c in args.cases.split(",") if c]
    if not cases or set(cases) - set(CASES):
        raise SystemExit(f"--cases: {args.cases!r}, each one of {', '.join(CASES)}")
    configs = {"A": per_case(args.config_a, "--config-a"), "B": per_case(args.config_b, "--config-b")}
    allow_diff = set(args.allow_diff.split(",")) - {""}
    from mla_core_cuda import decode
    mods = {"A": load_cuda_extension(args.src_a), "B": load_cuda_extension(args.src_b)}
    cuda = mla_core.get_backend("cuda")
    print(f"# {device_info()}\n# A = {args.src_a} ({mods['A'].__name__}) {configs['A'] or 'default'}, B = "
          f"{args.src_b} ({mods['B'].__name__}) {configs['B'] or 'default'}; q {args.q_dtype}", flush=True)
    rows, bad = [], []
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for length in ints(args.lengths):
                q, cache, table, lens = make_inputs(batch, heads, length)
                codes, kv_scale = fp8_cache(cache)
                if args.q_dtype == "fp16":
                    q, cache = q.half(), cache.half()
                for case in cases:
                    problem, call = case_call(case, q, cache, codes, kv_scale, table, lens)
                    default = cuda.configs(problem)[0]
                    side = {s: (mods[s], configs[s].get(case, default)) for s in ("A", "B")}
                    (out_a, lse_a), (out_b, lse_b) = (decode.run(m, call, c) for m, c in side.values())
                    r = dict(case=case, heads=heads, batch=batch, length=length,
                             config_a=json.dumps(side["A"][1]), config_b=json.dumps(side["B"][1]),
                             splits_a=decode.num_splits(call, side["A"][1]),
                             splits_b=decode.num_splits(call, side["B"][1]),
                             bitequal=same_bits(out_a, out_b) and same_bits(lse_a, lse_b),
                             rel_l2=rel_l2(out_b, out_a), lse_diff=(lse_b - lse_a).abs().max().item())
                    ok = r["bitequal"] or (case in allow_diff and not torch.isnan(out_b).any().item()
                                           and r["rel_l2"] < 1e-2 and r["lse_diff"] < 1e-3)
                    times = {"A": [], "B": []}
                    for s in ORDER:
                        m, c = side[s]
                        times[s].append(time_graph(lambda m=m, c=c: decode.run(m, call, c), iters=20))
                    r["A"], r["B"] = statistics.median(times["A"]), statistics.median(times["B"])
                    r["B_over_A"] = r["B"] / r["A"]
                    fm = FLASHMLA_US.get((heads, batch, length)) if case == "bf16" and args.q_dtype == "bf16" else None
                    r["A_over_flashmla"] = r["A"] / fm if fm else None
                    r["B_over_flashmla"] = r["B"] / fm if fm else None
                    cache_bytes = (codes if case == "fp8_cache" else cache).element_size()
                    r["B_TBps"] = batch * length * (RANK + ROPE) * cache_bytes / r["B"] / 1e6
                    rows.append(r)
                    if not ok:
                        bad.append(r)
                    print(f"{case} H={heads} B={batch} L={length} (splits {r['splits_a']}/{r['splits_b']}): A "
                          f"{r['A']:.1f} B {r['B']:.1f} us, B/A {r['B_over_A']:.3f}"
                          + (f", vs FlashMLA A {r['A_over_flashmla']:.3f} B {r['B_over_flashmla']:.3f}" if fm else "")
                          + f"; B {r['B_TBps']:.2f} TB/s; B == A {r['bitequal']} (rel L2 {r['rel_l2']:.1e}, LSE "
                          f"{r['lse_diff']:.1e})" + ("" if ok else "  <-- CHECK FAILED"), flush=True)
                    del out_a, lse_a, out_b, lse_b, call
                del q, cache, codes, table, lens
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("case", "case", "s"), ("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"),
                       ("splits_b", "splits", "d"), ("A", "A us", ".1f"), ("B", "B us", ".1f"),
                       ("B_over_A", "B/A", ".3f"), ("A_over_flashmla", "A/FlashMLA", ".3f"),
                       ("B_over_flashmla", "B/FlashMLA", ".3f"), ("B_TBps", "B TB/s", ".2f"),
                       ("rel_l2", "rel L2", ".1e"), ("lse_diff", "LSE diff", ".1e")])
    print(f"rows passing the checks (bit-equal; within 1e-2 / 1e-3 in {sorted(allow_diff) or 'no'} cases): "
          f"{len(rows) - len(bad)} of {len(rows)}")
    write_json(f"bench_decode_ab{'_' + args.name if args.name else ''}.json",
               dict(device=device_info(), src_a=args.src_a, src_b=args.src_b, configs=configs,
                    q_dtype=args.q_dtype, rows=rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
