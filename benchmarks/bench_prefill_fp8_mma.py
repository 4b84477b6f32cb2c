"""The fp8 recipe's prefill on FP8 wgmma (config ``{"mma": "fp8"}``, csrc/mla_prefill_fp8.cu; round (l), branch
wip/prefill-fp8) against today's fp8 path, the bf16 kernel and cuDNN SDPA, in one process on the same inputs.

    python benchmarks/bench_prefill_fp8_mma.py --base DIR_A [--cases 4x4096 1x16384 ragged16] [--rounds 3]

DIR_A: a folder holding main's ``csrc/`` and ``backends/cuda/mla_core_cuda/`` (the A side, as in
bench_prefill_fp8_prepass_ab.py, whose harness this follows; A's extension built by A's own build module:
:func:`load_a`); B = this checkout. Cases as bench_prefill.py (causal,
128 heads, q/k 192, v 128, randn inputs); the fp8 recipe with calibrated amaxes (q 4.5, k 5.0, v 4.25, p 1.0).
Per case, in CUDA-graph replays with the L2 flushed (median µs of 10), each round in one order and the next reversed:
``A fp8`` (main's fp8 path: K / V codes pre-pass + the bf16-product kernel), ``B fp8`` (the same on this tree:
bit-equal to A), ``B fp8 mma`` (the new config: tile-image pre-pass + the FP8-wgmma kernel), ``B bf16`` and
``A bf16`` (the kernel unquantized), ``sdpa-cudnn`` (torch's scaled_dot_product_attention on its cuDNN backend,
bf16, bench_prefill's views; eager where a graph cannot hold it). Then the pre-passes alone (A's codes of K and V,
B's tile images). TFLOP/s counts 2 · (192 + 128) FLOPs per visible pair per head; ``x cudnn`` is the time over
sdpa-cudnn's. Accuracy of the new config against B's default fp8 path on the same call: out rel-L2 and max |ΔLSE| /
max |LSE| (the gate: rel-L2 < 1e-2, |ΔLSE| <= 1e-4 + numerics.FP8_MMA_LSE_RTOL · max|LSE|). Exit 1 if A and B's
default paths are not bit-equal or the new config misses the gate. JSON to $OUT/bench_prefill_fp8_mma.json.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import CASES, HEADS, QK_DIM, V_DIM, make_inputs, sdpa_cudnn, visible_pairs  # noqa: E402
from bench_prefill_fp8_prepass_ab import import_launcher  # noqa: E402
from common import device_info, load_cuda_extension, print_table, same_bits, timed, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")

from mla_core import numerics, specs  # noqa: E402
from mla_core_cuda import prefill as prefill_b  # noqa: E402

AMAX = dict(q_amax=4.5, k_amax=5.0, v_amax=4.25, p_amax=1.0)


def load_a(base: str):
    """(A's launcher, A's extension): A's own mla_core_cuda package (its SOURCES: main has no mla_prefill_fp8.cu)
    building A's csrc (``base/csrc``, found from the package's place; the default build cache, keyed by content)."""
    launcher = import_launcher(base)
    build = importlib.import_module("mla_core_cuda_ab_a.build")
    os.environ.pop("MLA_CORE_CUDA_SRC", None)
    build._DEFAULT_KEY = None
    return launcher, build.build()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="A: folder with csrc/ and backends/cuda/mla_core_cuda/")
    ap.add_argument("--cases", nargs="*", default=["4x4096", "1x16384", "ragged16"], choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    launch_a, mod_a = load_a(args.base)
    mods = {"A": mod_a, "B": load_cuda_extension(os.path.join(here, "..", "csrc"))}
    launch = {"A": launch_a, "B": prefill_b}
    print(f"# {device_info()}\n# A = {args.base} ({mods['A'].__name__}), B = this checkout ({mods['B'].__name__})",
          flush=True)
    rows, failures = [], 0
    for case in args.cases:
        seqs = CASES[case]
        inputs = make_inputs(seqs)
        flops = 2 * (QK_DIM + V_DIM) * visible_pairs(seqs) * HEADS
        calls = {}
        for recipe, fmt in (("bf16", None), ("fp8", "fp8")):
            calls[recipe] = specs.validate_prefill(
                *inputs, None, True, True, q_quant=fmt, k_quant=fmt, p_quant=fmt, v_quant=fmt, sparsity_n=0,
                sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64, **AMAX)[1]
        label, cudnn_fn = sdpa_cudnn(inputs, seqs)
        fns = {"A fp8": lambda: launch["A"].run(mods["A"], calls["fp8"], {}),
               "B fp8": lambda: launch["B"].run(mods["B"], calls["fp8"], {}),
               "B fp8 mma": lambda: launch["B"].run(mods["B"], calls["fp8"], prefill_b.FP8_MMA),
               "B bf16": lambda: launch["B"].run(mods["B"], calls["bf16"], {}),
               "A bf16": lambda: launch["A"].run(mods["A"], calls["bf16"], {}),
               f"sdpa-cudnn ({label})": cudnn_fn}
        got = {name: fns[name]() for name in ("A fp8", "B fp8", "B fp8 mma", "A bf16", "B bf16")}
        same = all(same_bits(x, y) for r in ("fp8", "bf16") for x, y in zip(got[f"A {r}"], got[f"B {r}"]))
        ref_out, ref_lse = got["B fp8"]
        out, lse = got["B fp8 mma"]
        err = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
        finite = torch.isfinite(ref_lse)
        lse_max = ref_lse[finite].abs().max().item()
        dlse = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        ok = err < 1e-2 and dlse <= 1e-4 + numerics.FP8_MMA_LSE_RTOL * lse_max and bool(
            torch.equal(lse[~finite], ref_lse[~finite]))
        failures += (not same) + (not ok)
        print(f"{case}: A/B default paths bit-equal {same}; fp8 mma vs B fp8: out rel-L2 {err:.2e}, max |dLSE| "
              f"{dlse:.2e} (max |LSE| {lse_max:.1f}, bound {1e-4 + numerics.FP8_MMA_LSE_RTOL * lse_max:.2e}): "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        del got, out, lse, ref_out, ref_lse
        torch.cuda.empty_cache()
        times = {name: [] for name in fns}
        modes = {}
        for rnd in range(args.rounds):
            for name in (list(fns) if rnd % 2 == 0 else list(fns)[::-1]):
                us, modes[name] = timed(fns[name], f"{case} {name}")
                times[name].append(us)
        kv = [(inputs[1], AMAX["k_amax"]), (inputs[2], AMAX["v_amax"])]
        pre = {"A codes K+V": lambda: launch["A"].fp8_codes(mods["A"], kv),
               "B tile images": lambda: _tile_images(mods["B"], calls["fp8"])}
        pre_us = {name: statistics.median(timed(fn)[0] for _ in range(args.rounds)) for name, fn in pre.items()}
        cudnn_us = statistics.median(times[f"sdpa-cudnn ({label})"])
        for name, ts in times.items():
            us = statistics.median(ts)
            rows.append(dict(case=case, path=name, mode=modes[name], us=us, tflops=flops / us / 1e6,
                             x_cudnn=us / cudnn_us, spread=max(ts) / min(ts) - 1))
            print(f"  {case} {name}: {us:.0f} µs ({modes[name]}), {flops / us / 1e6:.0f} TFLOP/s, "
                  f"{us / cudnn_us:.3f} x cudnn; rounds {[round(t) for t in ts]}", flush=True)
        for name, us in pre_us.items():
            rows.append(dict(case=case, path=f"pre-pass: {name}", mode="graph", us=us))
            print(f"  {case} pre-pass {name}: {us:.0f} µs", flush=True)
        for r in rows:
            if r["case"] == case and r["path"] in ("B fp8 mma", "B fp8", "A fp8"):
                r["x_A_fp8"] = r["us"] / statistics.median(times["A fp8"])
        del fns, pre, calls, inputs
        torch.cuda.empty_cache()
    print()
    print_table(rows, COLUMNS)
    print(f"\nsummary: {len(rows)} rows, {failures} failed checks (A/B bit-equality, the new config's accuracy)")
    write_json("bench_prefill_fp8_mma.json", {"device": device_info(), "rows": rows, "amax": AMAX})
    if failures:
        raise SystemExit(1)


def _tile_images(module, call):
    """B's pre-pass alone: the tile images of the call's K and V (as prefill._run_fp8_mma makes them)."""
    k, v = call.k, call.v
    ks, vs = (prefill_b.f32(numerics.fp8_scale(a)) for a in (call.k_amax, call.v_amax))
    cu_k = call.cu_seqlens_k.to(torch.int32)
    batch = cu_k.shape[0] - 1
    images = torch.empty((module.fp8_tile_image_slots(k.shape[0], batch), k.shape[1], prefill_b.FP8_TILE_IMAGE_BYTES),
                         dtype=torch.uint8, device=k.device)
    module.fp8_tile_images(k, v, cu_k, images, ks, prefill_b._f32_reciprocal(ks), vs, prefill_b._f32_reciprocal(vs),
                           False)
    return images


COLUMNS = [("case", "case", "s"), ("path", "path", "s"), ("mode", "mode", "s"), ("us", "µs", ".0f"),
           ("tflops", "TFLOP/s", ".0f"), ("x_cudnn", "x cudnn", ".3f"), ("x_A_fp8", "x A fp8", ".3f"),
           ("spread", "max spread", ".3f")]

if __name__ == "__main__":
    main()
