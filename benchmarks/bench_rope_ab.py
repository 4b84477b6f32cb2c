"""A/B of two versions of the musa_fp8 fused RoPE + FP8 quantize kernel (issue 10): one process, the same inputs,
A and B timed alternately (A, B's configs, then the same in reverse; the median of each one's two timings), so
clock and run-to-run drift fall on both alike.

    python benchmarks/bench_rope_ab.py --base DIR [--tokens 4096,16384] [--heads 128] [--neox-tokens 4096]

DIR: a folder holding the base's ``backends/musa_fp8/mla_core_musa_fp8`` package (benchmarks/run_rope_ab.sh says
how to make one); A = its ``rope.py`` at its first config (the default), B = this checkout's ``rope.py`` at each of
its configs; ``--extra LABEL=DIR``: more snapshots, each at its first config. Inputs: bench_rope.py's (bf16,
float32 cos/sin, int64 positions, outputs as slices of 576-byte rows), interleaved pairs; NeoX too at
``--neox-tokens``. Per row: µs of CUDA-graph replays with the L2 flushed before each, GB/s of the bytes read +
written (bench_rope.py's count) and its % of the copy bandwidth measured in the same run, the reference backend's
time (eager through the public op as bench_rope.py; and as a CUDA graph) and its ratio to B's best. The output
rows of every B config and extra are compared with A's byte for byte (all round the same float32 values to E4M3:
they must be equal). JSON to $OUT/bench_rope_ab.json; exit status 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_rope import make_inputs  # noqa: E402  (sets MLA_CORE_CHECKS=metadata, MLA_CORE_AUTOTUNE=off)
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

import mla_core  # noqa: E402
from mla_core import specs  # noqa: E402


def load_base(folder: str, label: str = "base"):
    """A snapshot's rope module, imported as package ``rope_ab_<label>`` from ``folder`` (its fp8bits beside it)."""
    pkg = os.path.join(os.path.abspath(folder), "backends", "musa_fp8", "mla_core_musa_fp8")
    name = f"rope_ab_{label}"
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.rope")


def rows_like(inputs):
    """NaN-filled 576-byte query / key rows and the four output slices into them."""
    q_rope = inputs[0]
    nnz, heads, _ = q_rope.shape
    q_rows = torch.full((nnz, heads, 576), float("nan"), dtype=torch.float8_e4m3fn, device=q_rope.device)
    k_rows = torch.full((nnz, 576), float("nan"), dtype=torch.float8_e4m3fn, device=q_rope.device)
    return (q_rows, k_rows), (q_rows[..., 512:], k_rows[:, 512:], q_rows[..., :512], k_rows[:, :512])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="folder with the base's backends/musa_fp8/mla_core_musa_fp8")
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--heads", default="128")
    ap.add_argument("--neox-tokens", default="4096", help="token counts also timed with NeoX pairs ('' for none)")
    ap.add_argument("--extra", action="append", default=[], metavar="LABEL=DIR",
                    help="another snapshot folder, timed at its first config beside A and B (repeatable)")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    from mla_core_musa_fp8 import rope as rope_b
    rope_a = load_base(args.base)
    extras = {label: load_base(folder, label) for label, folder in (e.split("=", 1) for e in args.extra)}
    if any(label == "A" or label.startswith("B") for label in extras):
        sys.exit("--extra: a label may not be A or start with B (those name the base and this checkout's configs)")
    ceilings = measure_ceilings()
    print(f"# {device_info()}\n# copy {ceilings['copy_gbps']:.0f} GB/s; A = {rope_a.__file__}\n# B = {rope_b.__file__}",
          flush=True)
    neox_tokens = {int(t) for t in args.neox_tokens.split(",") if t}
    cases = [(int(t), int(h), False) for h in args.heads.split(",") for t in args.tokens.split(",")]
    cases += [(t, h, True) for t, h, _ in list(cases) if t in neox_tokens]
    rows, mismatches = [], 0
    for nnz, heads, neox in cases:
        inputs, _ = make_inputs(nnz, heads)
        (qa, ka), outs_a = rows_like(inputs)
        (qb, kb), outs_b = rows_like(inputs)
        problem, call_a = specs.validate_rope_quantize(*inputs, neox, None, 0.5, 2.0, *outs_a)
        _, call_b = specs.validate_rope_quantize(*inputs, neox, None, 0.5, 2.0, *outs_b)
        config_a = rope_a.configs(problem)[0]
        configs_b = rope_b.configs(problem)
        rope_a.run(call_a, config_a)
        others = [(rope_b, c) for c in configs_b] + [(m, m.configs(problem)[0]) for m in extras.values()]
        same = []
        for module, config in others:
            qb.fill_(float("nan"))
            kb.fill_(float("nan"))
            module.run(call_b, config)
            same.append(torch.equal(qa.view(torch.uint8), qb.view(torch.uint8))
                        and torch.equal(ka.view(torch.uint8), kb.view(torch.uint8)))
        mismatches += same.count(False)
        runs = {"A": lambda: rope_a.run(call_a, config_a)}
        runs.update({f"B{i}": (lambda c=c: rope_b.run(call_b, c)) for i, c in enumerate(configs_b)})
        runs.update({label: (lambda m=m: m.run(call_b, m.configs(problem)[0])) for label, m in extras.items()})
        times = {name: [] for name in runs}
        for name in list(runs) + list(reversed(runs)):
            times[name].append(time_graph(runs[name], iters=args.iters))
        us = {name: statistics.median(v) for name, v in times.items()}
        best = min((n for n in us if n.startswith("B")), key=us.get)
        kw = dict(is_neox=neox, quant_scale_q=0.5, quant_scale_kv=2.0)
        ref_eager = time_eager(lambda: mla_core.mla_rope_quantize_fp8(*inputs, backend="reference", **kw), iters=10)
        try:
            ref_graph = time_graph(lambda: mla_core.mla_rope_quantize_fp8(*inputs, backend="reference", **kw), iters=10)
        except RuntimeError as e:  # a capture the reference cannot take: report eager only
            print(f"# reference not capturable: {e}", flush=True)
            ref_graph = None
        moved = nnz * (heads + 1) * 576 * (2 + 1) + nnz * (64 * 4 + 8)
        r = dict(tokens=nnz, heads=heads, neox=neox, A=us["A"], A_config=config_a, B0=us["B0"], B=us[best],
                 B_config=configs_b[int(best[1:])], B_all={str(c): us[f"B{i}"] for i, c in enumerate(configs_b)},
                 extras={label: us[label] for label in extras}, bitequal=all(same), ref_eager=ref_eager,
                 ref_graph=ref_graph)
        r["B_over_A"] = r["B"] / r["A"]
        r["pct_copy_A"] = 100 * moved / r["A"] / 1e3 / ceilings["copy_gbps"]
        r["pct_copy_B"] = 100 * moved / r["B"] / 1e3 / ceilings["copy_gbps"]
        r["ref_over_B"] = ref_eager / r["B"]
        r["refgraph_over_B"] = ref_graph / r["B"] if ref_graph else None
        rows.append(r)
        each = ", ".join([f"{c} {us['B%d' % i]:.1f}" for i, c in enumerate(configs_b)]
                         + [f"{label} (its first config) {us[label]:.1f}" for label in extras])
        print(f"{nnz} x {heads} {'neox' if neox else 'interleaved'}: A {r['A']:.1f} us ({r['pct_copy_A']:.1f} % copy), "
              f"B best {r['B']:.1f} us ({r['pct_copy_B']:.1f} %, {r['B_config']}), B/A {r['B_over_A']:.3f}; "
              f"reference {ref_eager:.0f} us eager ({r['ref_over_B']:.1f}x B)"
              + (f", {ref_graph:.0f} us graph ({r['refgraph_over_B']:.1f}x)" if ref_graph else "")
              + f"; B configs {each}; == A bytes (B configs, extras): {same}", flush=True)
        del inputs, outs_a, outs_b, qa, ka, qb, kb, call_a, call_b
        torch.cuda.empty_cache()
    print()
    print_table(rows, [("tokens", "tokens", "d"), ("heads", "H", "d"), ("neox", "neox", "d"), ("A", "A µs", ".1f"),
                       ("B0", "B cfg0 µs", ".1f"), ("B", "B best µs", ".1f"), ("B_over_A", "B/A", ".3f"),
                       ("pct_copy_A", "A %copy", ".1f"), ("pct_copy_B", "B %copy", ".1f"),
                       ("ref_eager", "ref µs", ".0f"), ("ref_over_B", "ref/B", ".1f"),
                       ("refgraph_over_B", "refgraph/B", ".1f")])
    print(f"B's rows byte-equal to A's: {sum(r['bitequal'] for r in rows)} of {len(rows)} shapes (every B config)")
    write_json("bench_rope_ab.json", dict(device=device_info(), ceilings=ceilings, base=args.base, rows=rows))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
