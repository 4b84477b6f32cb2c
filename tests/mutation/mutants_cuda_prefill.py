"""Mutants of the CUDA prefill (csrc/mla_prefill_wgmma.cu, backends/cuda/mla_core_cuda/prefill.py): each is one
plausible bug tests/test_cuda_prefill.py's GPU tests must notice. ``old`` occurs exactly once in ``file``.

On a GPU machine, ``python3 tests/mutation/mutants_cuda_prefill.py`` judges every mutant with its ``tests`` selection
(the runner: gpu_mutants.py; builds reused from ``$MUTANT_WORK``); ``--prepare`` only builds (a device script starts
it beside the main build and runs the tests later).
"""
from __future__ import annotations

SELECTION = ("tests/test_cuda_prefill.py::test_gpu_boundary_lengths "
             "tests/test_cuda_prefill.py::test_gpu_cached_prefix_and_gqa "
             "tests/test_cuda_prefill.py::test_gpu_fp8 "
             "tests/test_cuda_prefill.py::test_gpu_nan_and_inf_rows_between_sequences")
"""Fast cases: tile-edge lengths both ways, cached prefixes and GQA, the FP8 recipes, poisoned rows between sequences."""

MUTANTS = [
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="for (int idx = lane; idx < (kBN - tail_keys) * 16; idx += 32)",
         new="for (int idx = lane; idx < 0; idx += 32)",
         tests=[SELECTION], gpu=True,
         why="tail guard dropped: V rows past a sequence's end (the next sequence's NaN / Inf) reach P·V as 0 · Inf"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="if (key >= len_k || (p.causal && key > qr + off)) sc[e] = -INFINITY;",
         new="if (key >= len_k || (p.causal && key > qr + off + 1)) sc[e] = -INFINITY;",
         tests=[SELECTION], gpu=True,
         why="causal mask off by one: each query also sees the key after its diagonal"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="const bool need_mask = key0 + kBN > len_k || (p.causal",
         new="const bool need_mask = (p.causal",
         tests=[SELECTION], gpu=True,
         why="no tail mask when non-causal: the next sequence's keys score in the last tile"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="  return last_key < 0 ? 0 : last_key / kBN + 1;",
         new="  return last_key < 0 ? 0 : (last_key + 1) / kBN;",
         tests=[SELECTION], gpu=True,
         why="causal tile count one short when the block's last visible key opens a key tile"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="  const int hk = h / (p.heads / p.kv_heads);",
         new="  const int hk = h % p.kv_heads;",
         tests=[SELECTION], gpu=True,
         why="wrong GQA head: query heads interleaved over kv heads instead of grouped"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="    if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) scale_rows64(o, a_lo, a_hi);\n",
         new="",
         tests=[SELECTION], gpu=True,
         why="no rescale of O when the running maximum grows: earlier tiles kept against the old maximum"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="        out_scale = f32(out_scale) * p_scale",
         new="        out_scale = f32(out_scale)",
         tests=[SELECTION], gpu=True,
         why="P's FP8 scale not applied to O: the codes' sum left 448x too large"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="        scale_qk *= s\n    if call.v_quant",
         new="    if call.v_quant",
         tests=[SELECTION], gpu=True,
         why="K's FP8 scale left out of the score scale (Q / K codes multiplied as if scale 1)"),
]


if __name__ == "__main__":
    import os
    import shlex
    import sys
    from pathlib import Path

    import gpu_mutants
    work = Path(os.environ.get("MUTANT_WORK", "/tmp/mla_core_prefill_mutants"))
    raise SystemExit(gpu_mutants.run(MUTANTS, lambda m: shlex.split(m["tests"][0]), work=work,
                                     prepare_only="--prepare" in sys.argv))
