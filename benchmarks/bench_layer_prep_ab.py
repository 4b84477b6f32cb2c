"""A/B of the eager MLAAttention decode step: the layer's prep as its own Triton launch against the prep inside the
cuda decode's one extension call (backends/triton/mla_core_triton/layer.py ``CUDA_PREP``; benchmarks/NOTES.md,
"Eager decode: the prep inside the cuda call").

    python3 benchmarks/bench_layer_prep_ab.py [--heads 128,16] [--length 8192] [--rounds 3]

One process, one module per head count (random weights, DeepSeek-V3 dims, bf16, batch 1, page 64, L cached
tokens): per round both arms in alternating order, each in both check modes, timed as bench_layer.py's module table
times them (event-timed eager steps with an L2 flush between, and one call + synchronize on the host's clock); the
medians over rounds. Before timing, one step of each arm from the same cache state: outputs and the written cache
row must be bit-equal, and the CUDA arm must have gone through ``layer_decode`` (else the row says so: the attention
ran elsewhere and the A/B measures nothing). Writes ``$OUT/bench_layer_prep_ab.json`` when $OUT is set.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_layer import HIDDEN, _checks, _hf_config, _timer, _wall_timer  # noqa: E402
from common import device_info, print_table, write_json  # noqa: E402


def _arm_step(layer, on, step):
    layer.CUDA_PREP = on
    return step()


def bench(heads: int, length: int, rounds: int, iters: int) -> dict:
    from mla_core.nn import MLAAttention, StaticPageTable
    from mla_core_cuda import backend as cuda_backend
    from mla_core_triton import layer
    eager, _ = _timer("cuda")
    wall = _wall_timer("cuda")
    config = _hf_config(heads)
    table = StaticPageTable(1, length + 64, 64, device="cuda")
    mine = MLAAttention(config, num_pages=table.num_pages, page_size=64, dtype=torch.bfloat16, device="cuda")
    mine.latent_cache.normal_()
    table.lengths.fill_(length - 1)
    hidden = torch.randn(1, HIDDEN, device="cuda").to(torch.bfloat16)
    offsets = torch.arange(2, device="cuda")

    def step():
        with torch.no_grad():
            return mine(hidden, offsets, table.block_table, table.lengths, max_seq_len=1)

    fused = []
    real = cuda_backend.CudaBackend.layer_decode

    def counted(self, *a):
        fused.append(1)
        return real(self, *a)
    cuda_backend.CudaBackend.layer_decode = counted
    try:
        page, slot = int(table.block_table[0, (length - 1) // 64]), (length - 1) % 64
        outs, rows = [], []
        for on in (False, True):
            outs.append(_arm_step(layer, on, step).clone())
            torch.cuda.synchronize()
            rows.append(mine.latent_cache[page, slot].clone())
        ran = len(fused) == 1
        equal = torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)) and torch.equal(
            rows[0].view(torch.int16), rows[1].view(torch.int16))
        times = {(on, mode, clock): [] for on in (False, True) for mode in ("full", "metadata")
                 for clock in ("event", "wall")}
        for r in range(rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                layer.CUDA_PREP = on
                for mode in ("full", "metadata"):
                    with _checks(mode):
                        times[(on, mode, "event")].append(eager(step, iters=iters))
                        times[(on, mode, "wall")].append(wall(step, iters=iters))
    finally:
        cuda_backend.CudaBackend.layer_decode = real
        layer.CUDA_PREP = True
    med = {k: statistics.median(v) for k, v in times.items()}
    row = dict(heads=heads, length=length, bit_equal=equal, cuda_prep_ran=ran)
    for mode in ("full", "metadata"):
        for clock in ("event", "wall"):
            a, b = med[(False, mode, clock)], med[(True, mode, clock)]
            tag = f"{mode}_{clock}"
            row[f"triton_prep_{tag}_us"], row[f"cuda_prep_{tag}_us"], row[f"delta_{tag}_us"] = a, b, b - a
    del mine
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", default="128,16")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device")
    print(f"device: {device_info()}")
    rows = []
    for h in (int(x) for x in args.heads.split(",")):
        rows.append(bench(h, args.length, args.rounds, args.iters))
        print(rows[-1], flush=True)
    cols = [("heads", "heads", "d"), ("bit_equal", "bit-equal", "s"), ("cuda_prep_ran", "cuda prep ran", "s")]
    for mode in ("metadata", "full"):
        for clock in ("event", "wall"):
            tag = f"{mode}_{clock}"
            cols += [(f"triton_prep_{tag}_us", f"triton {tag}", ".1f"), (f"cuda_prep_{tag}_us", f"cuda {tag}", ".1f"),
                     (f"delta_{tag}_us", "delta", "+.1f")]
    print(f"\n# eager MLAAttention step, batch 1, L {args.length}: the Triton prep vs the prep inside the cuda call "
          f"(medians of {args.rounds} alternating rounds, µs)")
    print_table([dict(r, bit_equal=str(r["bit_equal"]), cuda_prep_ran=str(r["cuda_prep_ran"])) for r in rows], cols)
    write_json("bench_layer_prep_ab.json", dict(device=device_info(), rows=rows))
    return 0 if all(r["bit_equal"] and r["cuda_prep_ran"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
