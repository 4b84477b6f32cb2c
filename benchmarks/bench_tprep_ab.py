"""A/B of the Triton layer's prefill prep (``layer._prep`` with COPY_NOPE, ROWS) on the GPU: A = a snapshot's
layer.py (main's: stride-2 rope pair loads), B = this tree's (rope rows whole, pairs split in registers).

    python3 benchmarks/bench_tprep_ab.py --a benchmarks/ab_tprep_base/backends/triton/mla_core_triton/layer.py

bench_layer's prefill inputs (128 heads, 4 x 4096 new tokens, bf16, interleaved rope, no cached prefix): q_pre,
the key rows and the cache bit-equal between the arms (exit 1 if not), then ``--rounds`` alternating rounds of
``--iters`` launches each, CUDA-event timed; prints µs per launch (median over rounds), the B / A ratio and the
bytes moved (q read + q_pre written + kv read + rows and cache rows written) over time. Arms ``B8`` / ``B32``: B with
8 / 32 heads a loop trip instead of 16 (half / twice the bytes in flight a trip; a probe of whether the loop is
latency-bound, not a proposed setting); checked bit-equal too.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_layer import layer_inputs  # noqa: E402


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _with_block_h(mod, block_h):
    """``mod``'s ``_prep`` launching BLOCK_H = ``block_h`` heads a loop trip."""
    def prep(*args, **kwargs):
        saved = mod._prep_constants
        mod._prep_constants = lambda *a: {**saved(*a), "BLOCK_H": block_h}
        try:
            return mod._prep(*args, **kwargs)
        finally:
            mod._prep_constants = saved
    return types.SimpleNamespace(_prep=prep)


def _call(heads, batch, new_tokens, interleave):
    a = layer_inputs(heads, batch, new_tokens, new_tokens, "cuda")
    return types.SimpleNamespace(
        q=a["q"], kv=a["kv"], latent_cache=a["latent_cache"], block_table=a["block_table"],
        input_row_offsets=a["input_row_offsets"], cache_offsets=a["cache_offsets"], freqs_cis=a["freqs_cis"],
        kv_norm_gamma=a["kv_norm_gamma"], epsilon=1e-6, nope_dim=128, rope_dim=64, kv_lora_rank=512,
        rope_interleave=interleave)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the A side's layer.py")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--interleave", type=int, default=1)
    args = ap.parse_args()
    from mla_core_triton import layer as b_mod
    arms = {"A": _load(args.a, "tprep_layer_a"), "B": b_mod, "B8": _with_block_h(b_mod, 8),
            "B32": _with_block_h(b_mod, 32)}
    call = _call(args.heads, 4, 4096, bool(args.interleave))
    tokens, heads = call.q.shape[:2]
    out = {}
    for name, mod in arms.items():
        cache = call.latent_cache.clone()
        c = types.SimpleNamespace(**{**vars(call), "latent_cache": cache})
        q_pre = torch.full((tokens, heads, 192), float("nan"), dtype=torch.bfloat16, device="cuda")
        rows = torch.full((tokens, 576), float("nan"), dtype=torch.bfloat16, device="cuda")
        mod._prep(c, q_pre, 128, True, None, None, {"num_warps": 4}, rows=rows)
        out[name] = (c, q_pre, rows, cache)
    same = all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for name in arms if name != "A"
               for x, y in zip(out["A"][1:], out[name][1:]))
    print(f"bit-equal q_pre, rows, cache (A vs {', '.join(n for n in arms if n != 'A')}): {same}")
    times = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, mod in arms.items():
            c, q_pre, rows, _ = out[name]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                mod._prep(c, q_pre, 128, True, None, None, {"num_warps": 4}, rows=rows)
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / args.iters)
    nbytes = 2 * (2 * call.q.numel() + call.kv.numel() + 2 * tokens * 576)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in arms:
        print(f"{k + ':':4} {med[k]:8.1f} us  (rounds {min(times[k]):.1f}..{max(times[k]):.1f})  "
              f"{nbytes / med[k] / 1e6:.2f} TB/s of {nbytes / 1e9:.2f} GB")
    print(f"B / A = {med['B'] / med['A']:.3f}, B8 / A = {med['B8'] / med['A']:.3f}, "
          f"B32 / A = {med['B32'] / med['A']:.3f}  ({torch.cuda.get_device_name()}, {args.heads} heads, 4 x 4096, "
          f"interleave {args.interleave})")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
