"""A/B of the WGMMA decode's schedules (issue 9, branch wip/decode-128-heads-w): A = a snapshot of main's csrc/
(the seesaw), B (C, ...) = this branch's csrc/ with MLA_CORE_CUDA_DECODE_SCHEDULE=q1 (q1p, ...: S of the whole
64-key step on one warpgroup, Q read once per step; q1p pipelined). One process, the same inputs, A B C C B A per
shape (CUDA-graph replays, L2 flushed, the median of each arm's two timings), bf16 (or fp16) unquantized,
page 64, full lengths, num_kv_splits="auto".

    python benchmarks/bench_decode_w_ab.py --src-a DIR_A --src-b DIR_B [--heads 128,16] [--batch 32,128]
        [--lengths 8192,32768] [--dtype bf16] [--schedules q1,q1p]

Per shape and arm X: A µs, X µs, X / A, X / FlashMLA (the H200 times quoted in docs/cuda.md /
benchmarks/NOTES.md where measured), and whether X's outputs and LSE equal A's bit for bit (predicted: Q1 does
each element's arithmetic in the seesaw's order); if not, X's rel L2 against A (the reference tolerance is the
GPU tests' job). Builds both first (benchmarks/run_decode_w_ab.sh does, keeping compile time out of this call).
JSON to $OUT/bench_decode_w_ab.json; exit 1 when an output differs from A's.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import make_inputs  # noqa: E402
from common import device_info, load_cuda_extension, print_table, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE = 512, 64
FLASHMLA_US = {(16, 32, 8192): 95.3, (16, 128, 32768): 1177.8, (128, 32, 8192): 133.0, (128, 128, 8192): 509.4,
               (128, 128, 32768): 1946.0}  # bf16, page 64, H200 (docs/cuda.md; NOTES "WGMMA probe" for the last)
SCHEDULE = "MLA_CORE_CUDA_DECODE_SCHEDULE"


@contextlib.contextmanager
def schedule(name):
    """The launcher reads the schedule per launch (a graph keeps the kernel its capture launched)."""
    old = os.environ.pop(SCHEDULE, None)
    if name:
        os.environ[SCHEDULE] = name
    try:
        yield
    finally:
        os.environ.pop(SCHEDULE, None)
        if old is not None:
            os.environ[SCHEDULE] = old


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-a", required=True)
    ap.add_argument("--src-b", required=True)
    ap.add_argument("--heads", default="128,16")
    ap.add_argument("--batch", default="32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--schedules", default="q1,q1p")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    from mla_core_cuda import decode
    mod_a, mod_b = load_cuda_extension(args.src_a), load_cuda_extension(args.src_b)
    scheds = args.schedules.split(",")
    arms = {"A": (mod_a, None), **{"BCDEF"[i]: (mod_b, name) for i, name in enumerate(scheds)}}
    others = [n for n in arms if n != "A"]
    cuda = mla_core.get_backend("cuda")
    print(f"# {device_info()}\n# A = {args.src_a} ({mod_a.__name__}); "
          + ", ".join(f"{n} = {args.src_b} ({mod_b.__name__}, {SCHEDULE}={arms[n][1]})" for n in others), flush=True)
    rows, mismatches = [], 0
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for length in ints(args.lengths):
                q, cache, table, lens = make_inputs(batch, heads, length)
                if args.dtype == "fp16":
                    q, cache = q.half(), cache.half()
                problem, call = validate_decode(
                    q, cache, table, lens, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                    qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None,
                    v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
                config = cuda.configs(problem)[0]
                outs = {}
                for name, (mod, sched) in arms.items():
                    with schedule(sched):
                        outs[name] = decode.run(mod, call, config)
                times = {n: [] for n in arms}
                order = list(arms)
                for name in order + order[::-1]:
                    mod, sched = arms[name]
                    with schedule(sched):
                        times[name].append(time_graph(lambda mod=mod: decode.run(mod, call, config), iters=20))
                r = dict(heads=heads, batch=batch, length=length, kernel=config.get("kernel", "mma.sync"),
                         A=statistics.median(times["A"]))
                fm = FLASHMLA_US.get((heads, batch, length))
                line = f"H={heads} B={batch} L={length} ({r['kernel']}): A {r['A']:.1f} us"
                for n in others:
                    same = all(torch.equal(bits(a), bits(b)) for a, b in zip(outs["A"], outs[n]))
                    mismatches += not same
                    r[n] = statistics.median(times[n])
                    r[f"{n}_over_A"] = r[n] / r["A"]
                    r[f"{n}_over_FlashMLA"] = r[n] / fm if fm else float("nan")
                    r[f"{n}_bitequal"] = same
                    if not same:
                        r[f"{n}_rel_l2_out"] = rel_l2(outs[n][0], outs["A"][0])
                    line += (f"; {arms[n][1]} {r[n]:.1f} us, /A {r[n + '_over_A']:.3f}, /FlashMLA "
                             f"{r[n + '_over_FlashMLA']:.2f}, == A: {same}"
                             + ("" if same else f" (rel L2 {r[n + '_rel_l2_out']:.2e})"))
                rows.append(r)
                print(line, flush=True)
                del q, cache, table, lens, outs
                torch.cuda.empty_cache()
    print()
    cols = [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"), ("A", "A µs", ".1f")]
    for n in others:
        cols += [(n, f"{arms[n][1]} µs", ".1f"), (f"{n}_over_A", f"{arms[n][1]}/A", ".3f"),
                 (f"{n}_over_FlashMLA", f"{arms[n][1]}/FlashMLA", ".2f")]
    print_table(rows, cols)
    print(f"outputs and LSE bit-equal to A's: {len(rows) * len(others) - mismatches} of {len(rows) * len(others)}"
          f" (shape, schedule)")
    write_json("bench_decode_w_ab.json", dict(device=device_info(), src_a=args.src_a, src_b=args.src_b,
                                              schedules=scheds, rows=rows))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
