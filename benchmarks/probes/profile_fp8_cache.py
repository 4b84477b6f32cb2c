"""Driver of profile_fp8_cache.sh (issue 9: why the FP8-cache decode moves ~1.5 TB/s while the bf16 cache moves ~3.2).

    python3 profile_fp8_cache.py build --src DIR --cache DIR          # build one extension (run two in parallel)
    python3 profile_fp8_cache.py run --src-a DIR --cache-a DIR --src-b DIR --cache-b DIR
        [--heads 16] [--batch 32] [--length 32768] [--splits auto|N] [--dry-run]
    python3 profile_fp8_cache.py summarize --raw RAW.csv --sass SASS.csv --out DIR

``run`` (under ncu --profile-from-start off): page 64, full lengths, the config dispatch lists first; warm-up and a
graph-replay time (µs, L2 flushed) of each variant, then ONE launch each inside cudaProfilerStart/Stop, in this
order: bf16 cache on A (decode_wgmma_kernel), FP8 cache on A (decode_wgmma_kernel, KF = kCodes), FP8 cache on B
(decode_t_kernel at <= 16 heads). ``summarize`` reads ncu's raw page (one row per kernel) and source page (SASS,
per-instruction pc samples), writes per-kernel files to --out and prints a compact summary: duration, DRAM bytes
and bandwidth, pipe and issue utilization, stall reasons per region (producer = the code from the warp's
USETMAXREG.DEALLOC to the next EXIT; consumer = the rest before the last EXIT; stubs = after it, the try-wait
retry loops) and per instruction class (mbarrier waits, wgmma waits, HGMMA, conversion, LDS, cp.async, ...).
``--dry-run`` checks the arguments and prints the plan without CUDA.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = (("bf16_A", "a", False), ("fp8_A", "a", True), ("fp8_B", "b", True))  # profiled in this order
RANK, ROPE = 512, 64


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--src", required=True)
    b.add_argument("--cache", required=True)
    r = sub.add_parser("run")
    for x in ("a", "b"):
        r.add_argument(f"--src-{x}", required=True)
        r.add_argument(f"--cache-{x}", required=True)
    r.add_argument("--heads", type=int, default=16)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--length", type=int, default=32768)
    r.add_argument("--splits", default="auto", help="auto (the library's choice) or a split count")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--dry-run", action="store_true")
    s = sub.add_parser("summarize")
    s.add_argument("--raw", required=True)
    s.add_argument("--sass", required=True)
    s.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.splits != "auto" and not (args.splits.isdigit() and int(args.splits) >= 1):
            ap.error(f"--splits must be auto or a positive integer, got {args.splits!r}")
        if min(args.heads, args.batch, args.length) < 1:
            ap.error("--heads, --batch, --length must be >= 1")
        for x in ("a", "b"):
            src = getattr(args, f"src_{x}")
            if not os.path.isfile(os.path.join(src, "mla_decode_wgmma.cu")):
                ap.error(f"--src-{x} {src} holds no mla_decode_wgmma.cu (a csrc/ folder)")
    return args


def build(args):
    sys.path.insert(0, os.path.dirname(HERE))
    from common import load_cuda_extension
    m = load_cuda_extension(args.src, args.cache)
    print(m.__name__, m.__file__)
    return 0


def run(args):
    splits = "auto" if args.splits == "auto" else int(args.splits)
    plan = [f"{n}: {'FP8' if f8 else 'bf16'} cache on {x.upper()} ({getattr(args, 'src_' + x)})" for n, x, f8 in VARIANTS]
    print(f"# H{args.heads} B{args.batch} L{args.length} page 64 splits {splits}; profiled launches, in order: "
          + "; ".join(plan), flush=True)
    if args.dry_run:
        return 0
    os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
    os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")
    sys.path.insert(0, os.path.dirname(HERE))
    import torch
    from bench_decode import fp8_cache, make_inputs
    from common import load_cuda_extension, time_graph

    import mla_core
    from mla_core.specs import validate_decode
    from mla_core_cuda import decode

    mods = {"a": load_cuda_extension(args.src_a, args.cache_a), "b": load_cuda_extension(args.src_b, args.cache_b)}
    print(f"# A = {mods['a'].__name__}, B = {mods['b'].__name__}", flush=True)
    cuda = mla_core.get_backend("cuda")
    q, cache, table, lens = make_inputs(args.batch, args.heads, args.length)
    codes, kv_scale = fp8_cache(cache)
    torch.cuda.empty_cache()  # fp8_cache's float32 copy: not held while ncu replays

    def prepared(latent, scale):
        problem, call = validate_decode(
            q, latent, table, lens, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
            page_size=None, num_kv_splits=splits, k_qdq=None, k_qdq_amax=None, v_qdq=None, v_qdq_amax=None,
            p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None, kv_scale=scale)
        return call, cuda.configs(problem)[0]

    calls = {False: prepared(cache, None), True: prepared(codes, kv_scale)}
    fns = {}
    for name, x, f8 in VARIANTS:
        call, config = calls[f8]
        fns[name] = lambda m=mods[x], c=call, cf=config: decode.run(m, c, cf)
        for _ in range(args.warmup):
            fns[name]()
        us = time_graph(fns[name], iters=10)
        nbytes = (codes if f8 else cache).numel() * (1 if f8 else 2)
        print(f"# {name}: splits {decode.num_splits(call, config)}, {us:.1f} us (graph, L2 flushed, split + combine), "
              f"{nbytes / us / 1e6:.2f} TB/s of cache bytes", flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, _, f8 in VARIANTS:
        fns[name]()
        torch.cuda.synchronize()
        if not f8:  # the bf16 cache's 2 bytes a value need not be saved and restored by ncu's replays of the rest
            del fns[name], calls[False], cache
            torch.cuda.empty_cache()
    torch.cuda.profiler.stop()
    print("# profiled launches done", flush=True)
    return 0


# ---- summarize ----------------------------------------------------------------------------------------------------

def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


UNIT = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6,
        "Gbyte": 1e9, "cycle/nsecond": 1e9, "cycle/usecond": 1e6, "cycle/msecond": 1e3, "cycle/second": 1.0}


def raw_rows(path):
    """ncu --page raw --csv: header row, units row, one row per profiled kernel -> list of dicts of strings, and
    a function (row, metric) -> the value in base units (seconds, bytes, Hz), nan if absent."""
    rows = [r for r in csv.reader(open(path, newline="")) if r]
    head = next((i for i, r in enumerate(rows) if r[0] == "ID"), None)
    if head is None:
        return [], None
    names, units = rows[head], dict(zip(rows[head], rows[head + 1]))

    def base(row, key):
        return num(row[key]) * UNIT.get(units.get(key, ""), 1.0) if key in row else float("nan")
    return [dict(zip(names, r)) for r in rows[head + 2:] if len(r) == len(names)], base


def sass_blocks(path):
    """ncu --page source --csv --print-source sass -> [(title, header, rows)], one block per kernel (a new block
    starts at every header row holding "Source" and the all-samples column)."""
    blocks, title, prev = [], "", []
    for r in csv.reader(open(path, newline="")):
        if "Source" in r and any(c.startswith("Warp Stall Sampling (All") for c in r):
            blocks.append([" ".join(prev)[:160] or title, r, []])
        elif blocks and len(r) == len(blocks[-1][1]):
            blocks[-1][2].append(r)
        prev = r
    return blocks


CLASSES = (  # (class, regex on the opcode) — first match wins; the instruction after a try-wait is "mbar wait"
    ("hgmma", r"^HGMMA"), ("wgmma wait", r"^WARPGROUP\.(DEPBAR|ARRIVE)"), ("mbar wait", r"^SYNCS\.PHASECHK"),
    ("mbar arrive", r"^SYNCS\.ARRIVE"), ("named barrier", r"^BAR\."), ("cp.async", r"^LDGSTS"),
    ("cp.async wait", r"^(LDGDEPBAR|DEPBAR)"), ("fp8 convert", r"^F2FP\..*E4M3|^F2F"),
    ("f16 widen / pack", r"^(HADD2\.F32|F2FP)"), ("byte permute", r"^PRMT"), ("lds", r"^LDS|^LDSM"),
    ("sts", r"^STS"), ("global ld/st", r"^(LDG|STG|RED|ATOM)"), ("shuffle / vote", r"^(SHFL|VOTE)"),
    ("ex2 / fp32 math", r"^(MUFU|FMUL|FFMA|FADD|FMNMX)"), ("branch", r"^(BRA|BRX|EXIT|RET|CALL)"),
)


def opcode(src):
    tok = src.split()
    if tok and tok[0].startswith("@"):
        tok = tok[1:]
    return tok[0] if tok else "?"


def classify(rows, hd):
    """Per SASS row: (region, class). Regions: producer (the warp's USETMAXREG.DEALLOC .. the last EXIT: ptxas
    places the producer's code after the consumers', and its first EXITs are predicated early exits), consumer
    (the code before it), stubs (after the last EXIT: the try-wait retry loops of both)."""
    ops = [opcode(r[hd["Source"]]) for r in rows]
    dealloc = next((i for i, o in enumerate(ops) if o.startswith("USETMAXREG") and "DEALLOC" in o), None)
    exits = [i for i, o in enumerate(ops) if o == "EXIT"]
    last_exit = exits[-1] if exits else len(ops) - 1
    out, after_wait = [], False
    for i, o in enumerate(ops):
        if i > last_exit:
            region = "stubs"
        elif dealloc is not None and dealloc <= i:
            region = "producer"
        else:
            region = "consumer"
        cls = next((c for c, rx in CLASSES if re.search(rx, o)), "other")
        if after_wait and rows[i][hd["Source"]].lstrip().startswith("@"):  # the try-wait's retry branch
            cls = "mbar wait"
        after_wait = o.startswith("SYNCS.PHASECHK")
        out.append((region, cls))
    return out


def top(counter, n=6, total=None):
    total = total or sum(counter.values()) or 1
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counter.most_common(n) if v)


def summarize(args):
    os.makedirs(args.out, exist_ok=True)
    kernels, base = raw_rows(args.raw)
    names = [v for v, _, _ in VARIANTS]
    cols = (("us", "gpu__time_duration.sum", 1e6), ("DRAM MB", "dram__bytes_read.sum", 1e-6),
            ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1),
            ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 1),
            ("issue %", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1),
            ("warp inst M", "smsp__inst_executed.sum", 1e-6),
            ("eligible/cyc", "smsp__warps_eligible.avg.per_cycle_active", 1),
            ("GHz", "sm__cycles_elapsed.avg.per_second", 1e-9), ("grid", "launch__grid_size", 1),
            ("regs", "launch__registers_per_thread", 1))
    print("kernel   " + "  ".join(c[0] for c in cols) + "  TB/s")
    for n, k in zip(names, kernels):
        v = [base(k, key) * f for _, key, f in cols]
        print(f"{n:8s} " + "  ".join(f"{x:.4g}" for x in v) + f"  {v[1] / v[0]:.2f}"
              + f"   [{k.get('Kernel Name', '')[:50]}]")
    with open(os.path.join(args.out, "raw_selected.txt"), "w") as f:  # every stall ratio and pipe counter
        for n, k in zip(names, kernels):
            f.write(f"== {n}: {k.get('Kernel Name', '')}\n")
            for key, val in k.items():
                if re.search(r"issue_stalled|pipe_|pcsamp|dram__|lts__t_|warps_eligible|issue_active|"
                             r"gpu__time|cycles_elapsed|l1tex__data|inst_executed", key):
                    f.write(f"{key} {val}\n")
    print(f"(raw: {len(kernels)} kernels; stall ratios and pipe counters in raw_selected.txt)")
    stall = "smsp__average_warps_issue_stalled_"
    for n, k in zip(names, kernels):  # the largest pipe utilizations and stall ratios per kernel
        pipes = sorted(((num(v), key) for key, v in k.items()
                        if re.match(r"sm__(inst_executed_)?pipe_\w+\.avg\.pct_of_peak_sustained_active$", key)),
                       reverse=True)[:5]
        stalls = sorted(((num(v), key) for key, v in k.items()
                         if key.startswith(stall) and key.endswith("_per_issue_active.ratio")), reverse=True)[:6]
        print(f"{n}: pipes " + ", ".join(f"{key.split('__')[1].split('.')[0]} {v:.0f}%" for v, key in pipes)
              + "; stalls/issue " + ", ".join(f"{key[len(stall):-len('_per_issue_active.ratio')]} {v:.2f}"
                                              for v, key in stalls))
    blocks = sass_blocks(args.sass)
    print(f"(sass: {len(blocks)} kernel blocks)")
    # ncu's source page may repeat a function's block (seen: 5 blocks for 3 results): name each block by the raw
    # row of the same kernel (names compared without namespaces, casts and spaces), first block of a name only
    key = lambda t: re.sub(r"\(int\)|mla_core_cuda::|<?unnamed>::|\s|^Kernel Name", "", t)  # noqa: E731
    by_kernel = {key(k.get("Kernel Name", "")): n for n, k in zip(names, kernels)}
    seen = set()
    for idx, (title, header, rows) in enumerate(blocks):
        name = next((n for kn, n in by_kernel.items() if kn and kn in key(title)), f"k{idx}")
        if name in seen:
            print(f"(block {idx}: {name} again, skipped)")
            continue
        seen.add(name)
        hd = {c: i for i, c in enumerate(header)}
        tot_col = next(c for c in header if c.startswith("Warp Stall Sampling (All"))
        reasons = [c for c in header if c.startswith("stall_")]
        ex_col = "Instructions Executed" if "Instructions Executed" in hd else None
        regions = classify(rows, hd)
        by_region, by_reason, by_class = Counter(), defaultdict(Counter), defaultdict(Counter)
        lines = []
        for i, (r, (region, cls)) in enumerate(zip(rows, regions)):
            samples = num(r[hd[tot_col]])
            by_region[region] += samples
            by_class[region][cls] += samples
            rs = Counter({c[6:]: num(r[hd[c]]) for c in reasons})
            by_reason[region].update(rs)
            by_reason[f"{region}/{cls}"].update(rs)
            lines.append((samples, i, region, cls, r[hd["Source"]].strip(), num(r[hd[ex_col]]) if ex_col else 0, rs))
        total = sum(by_region.values()) or 1
        with open(os.path.join(args.out, f"sass_{name}.txt"), "w") as f:
            f.write(f"# {name}: {title}\n# {total:.0f} pc samples; columns: {', '.join(header)}\n")
            for region in by_region:
                f.write(f"# {region}: {by_region[region]:.0f} samples; reasons: {top(by_reason[region], 8)}\n")
                for cls, v in by_class[region].most_common():
                    if v:
                        f.write(f"#   {cls}: {v:.0f} ({100 * v / total:.1f}% of all); "
                                f"{top(by_reason[f'{region}/{cls}'], 4)}\n")
            f.write("# index samples executions region class instruction  top reasons (every row with samples)\n")
            for samples, i, region, cls, src, ex, rs in lines:
                if samples:
                    f.write(f"{i:5d} {samples:7.0f} {ex:10.0f} {region[:4]} {cls:16s} {src[:70]:70s} "
                            f"{top(rs, 3, samples)}\n")
        print(f"{name} ({total:.0f} samples): " + ", ".join(f"{g} {100 * v / total:.0f}%" for g, v in by_region.most_common()))
        for region, v in by_region.most_common(2):
            print(f"  {region}: {top(by_reason[region], 5)} | {top(by_class[region], 5, v)}")
    return 0


def main(argv=None):
    args = parse(argv)
    return {"build": build, "run": run, "summarize": summarize}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
