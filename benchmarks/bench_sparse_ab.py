"""A/B of two builds of the CUDA sources on the FP8 sparse decode (issue 10): one process, the same inputs, the two
builds timed alternately (A B B A per row), so clock and run-to-run drift fall on both alike.

    python benchmarks/bench_sparse_ab.py --src-a DIR_A --src-b DIR_B [--cache-a C_A --cache-b C_B]
        [--layouts fp8,fp8_ds_mla] [--q-lens 1,2] [--bitequal LAYOUTS]

DIR_A / DIR_B: csrc/ folders, C_A / C_B their build caches (MLA_CORE_CACHE_DIR; build both beforehand to keep
compile time out of the timed call: benchmarks/run_sparse_ab.sh does). Rows: layout (576-byte ``fp8`` rows, 656-byte
``fp8_ds_mla`` rows) x q_len x FlashMLA's four (batch, heads) shapes, bench_sparse.py's inputs (top-k 2048 of a
32k-token cache, every slot valid), the default split count; per build the µs (CUDA-graph replays, L2 flushed, the
median of its two timings), B / A, FlashMLA's time over each (its q_len-1 figures). Each row's output and LSE of B
are compared with A's bit for bit: a change of the synchronization alone keeps every product and sum in the same
order, so they must be equal. ``--bitequal`` names the layouts held to that (default: all); on the others (a change
of rounding, e.g. 576-byte rows on f16 operands) B must agree with A within the contract's tolerances instead
(docs/sparse.md: out rel-L2 < 1e-2, LSE rel-L2 < 1e-5), and both distances are printed. Exit 1 on a failed
comparison or a non-finite output of B. JSON to $OUT/bench_sparse_ab.json.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_sparse import FLASHMLA_US, TOP_K, make_case  # noqa: E402
from common import device_info, load_cuda_extension, print_table, same_bits, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core import specs  # noqa: E402


def rel_l2(a, b):
    """||a - b|| / ||b|| in float64 (inf where a holds a NaN; b all zero: the norm of a - b)."""
    a, b = a.double(), b.double()
    if torch.isnan(a).any():
        return math.inf
    den = b.norm().item()
    return (a - b).norm().item() / (den if den else 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-a", required=True)
    ap.add_argument("--src-b", required=True)
    ap.add_argument("--cache-a", help="A's build cache (MLA_CORE_CACHE_DIR); default: the environment's")
    ap.add_argument("--cache-b", help="B's build cache")
    ap.add_argument("--layouts", default="fp8,fp8_ds_mla")
    ap.add_argument("--q-lens", default="1,2")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bitequal", help="layouts whose B must equal A bit for bit (default: every layout); the others "
                    "within out rel-L2 1e-2, LSE rel-L2 1e-5 of A")
    args = ap.parse_args()
    must_equal = set((args.bitequal if args.bitequal is not None else args.layouts).split(","))
    from mla_core_cuda import sparse
    mods = {"A": load_cuda_extension(args.src_a, args.cache_a), "B": load_cuda_extension(args.src_b, args.cache_b)}
    cuda = mla_core.get_backend("cuda")
    print(f"# {device_info()}\n# A = {args.src_a} ({mods['A'].__name__}), B = {args.src_b} ({mods['B'].__name__})",
          flush=True)
    rows, mismatches = [], 0
    for layout in args.layouts.split(","):
        for q_len in (int(x) for x in args.q_lens.split(",")):
            for (batch, heads), flashmla in FLASHMLA_US.items():
                query, cache, indices, seq_lens = make_case(layout, batch, q_len, heads)
                problem, call = specs.validate_sparse_decode(query, cache, 128, 512, 64, indices, seq_lens, TOP_K,
                                                             None, 576 ** -0.5, 1.0, None, True, None)
                config = cuda.configs(problem)[0]
                outs = {name: sparse.run(mod, call, config) for name, mod in mods.items()}
                same = all(same_bits(a, b) for a, b in zip(outs["A"], outs["B"]))
                finite = bool(torch.isfinite(outs["B"][0].float()).all())
                d_out = rel_l2(outs["B"][0], outs["A"][0])
                lse_a, lse_b = outs["A"][1].float(), outs["B"][1].float()
                rows_a = torch.isfinite(lse_a)
                d_lse = rel_l2(lse_b[rows_a], lse_a[rows_a]) if torch.equal(rows_a, torch.isfinite(lse_b)) else math.inf
                agree = same if layout in must_equal else (d_out < 1e-2 and d_lse < 1e-5)
                mismatches += (not agree) + (not finite)
                times = {"A": [], "B": []}
                for name in ("A", "B", "B", "A"):
                    mod = mods[name]
                    times[name].append(time_graph(lambda mod=mod: sparse.run(mod, call, config), iters=args.iters))
                r = dict(layout=layout, q_len=q_len, batch=batch, heads=heads,
                         splits=sparse.num_splits_for(batch * q_len, heads, TOP_K, torch.cuda.get_device_properties(
                             0).multi_processor_count, config),
                         A=statistics.median(times["A"]), B=statistics.median(times["B"]), bitequal=same,
                         must_equal=layout in must_equal, rel_out_b_a=d_out, rel_lse_b_a=d_lse, agree=agree)
                r["B_over_A"] = r["B"] / r["A"]
                if q_len == 1:
                    r["flashmla_over_A"], r["flashmla_over_B"] = flashmla / r["A"], flashmla / r["B"]
                rows.append(r)
                print(f"{layout} q={q_len} B={batch} H={heads} ({r['splits']} splits): A {r['A']:.1f} us, B "
                      f"{r['B']:.1f} us, B/A {r['B_over_A']:.3f}; outputs and LSE of B == A: {same} (out rel-L2 "
                      f"{d_out:.2e}, LSE {d_lse:.2e}; {'must be equal' if layout in must_equal else 'tolerance'}: "
                      f"{'ok' if agree else 'FAILED'})" + ("" if finite else "; B's output NOT finite"), flush=True)
                del query, cache, indices, seq_lens, outs
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("layout", "layout", "s"), ("q_len", "q", "d"), ("batch", "B", "d"), ("heads", "H", "d"),
                       ("splits", "splits", "d"), ("A", "A µs", ".1f"), ("B", "B µs", ".1f"),
                       ("B_over_A", "B/A", ".3f"), ("flashmla_over_A", "FlashMLA/A", ".2f"),
                       ("flashmla_over_B", "FlashMLA/B", ".2f")])
    print(f"outputs and LSE of B bit-equal to A's: {sum(r['bitequal'] for r in rows)} of {len(rows)} rows; "
          f"comparisons passed (bit-equal on {','.join(sorted(must_equal))}, else the tolerance): "
          f"{sum(r['agree'] for r in rows)} of {len(rows)}")
    write_json("bench_sparse_ab.json", dict(device=device_info(), src_a=args.src_a, src_b=args.src_b, rows=rows))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
