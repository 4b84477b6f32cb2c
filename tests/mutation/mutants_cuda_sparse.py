"""Mutants of the CUDA FP8 sparse decode (csrc/mla_sparse_wgmma.cu, backends/cuda/mla_core_cuda/sparse.py): each is
one plausible bug tests/test_cuda_sparse.py's GPU tests must notice. ``old`` occurs exactly once in ``file``.

On a GPU machine, ``python3 tests/mutation/mutants_cuda_sparse.py`` judges every mutant with its ``tests`` selection
(the runner: gpu_mutants.py; builds reused from ``$MUTANT_WORK``); ``--prepare`` only builds (a device script starts
it beside the main build and runs the tests later). ``SPARSE_MUTANTS=ds`` judges only the fp8_ds_mla ones.
"""
from __future__ import annotations

SELECTION = ("-m gpu tests/test_cuda_sparse.py::test_gpu_boundary_lengths[False-128-2] "
             "tests/test_cuda_sparse.py::test_gpu_boundary_lengths[True-64-3] "
             "tests/test_cuda_sparse.py::test_gpu_every_split_count "
             "tests/test_cuda_sparse.py::test_gpu_indices_outside_the_cache_are_not_keys")
"""Fast cases covering the length edges, holes, both cache shapes, every split count and indices past the cache."""
DS_SELECTION = ("-m gpu tests/test_cuda_sparse.py::test_gpu_ds_mla_boundary_lengths[False-128-2] "
                "tests/test_cuda_sparse.py::test_gpu_ds_mla_boundary_lengths[True-64-1] "
                "tests/test_cuda_sparse.py::test_gpu_every_split_count[config1-fp8_ds_mla] "
                "tests/test_cuda_sparse.py::test_gpu_every_split_count[config3-fp8_ds_mla] "
                "tests/test_cuda_sparse.py::test_gpu_indices_outside_the_cache_are_not_keys[fp8_ds_mla]")
"""The same edges on 656-byte fp8_ds_mla rows (one split of 32 tiles: both stages reused)."""

MUTANTS = [
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="  if (slot >= end) return -1;",
         new="  if (slot > end) return -1;",
         tests=[SELECTION], gpu=True,
         why="off by one at a split's end: the slot at the valid length (a NaN row) or the next split's first "
             "slot is a key"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="      const float x = flag[8 * (j >> 2) + 2 * (t & 3) + (j & 1)] ? sc[j] * p.scale_log2 : -INFINITY;",
         new="      const float x = sc[j] * p.scale_log2;",
         tests=[SELECTION], gpu=True,
         why="wrong mask: -1 slots and slots past the length score 0 (zero rows) instead of -inf"),
    dict(file="backends/cuda/mla_core_cuda/sparse.py",
         old="call.bmm1_scale * math.log2(math.e)",
         new="call.bmm1_scale",
         tests=[SELECTION], gpu=True,
         why="wrong scale: scores left in natural-log units while the kernel exponentiates base 2"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="p.part_o + ((tok * p.num_splits + i) * p.heads + h) * kNope + c",
         new="p.part_o + (tok * p.num_splits * p.heads + h) * kNope + c",
         tests=[SELECTION], gpu=True,
         why="wrong index: the combine reads split 0's partial output for every split"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="      reg_fence(o);\n      rescale(o, a2_lo, a2_hi);\n",
         new="      reg_fence(o);\n",
         tests=[SELECTION], gpu=True,
         why="no rescale between the two 32-key halves (warpgroup 0): P_0 V_0 kept against the old running maximum"),
    # the producer warpgroup (gather into the stage's upper half, in-place conversion, flags)
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="      nb_sync<kProducerThreads>(kBarProd);  // every producer thread's copies landed and visible\n",
         new="",
         tests=[SELECTION], gpu=True,
         why="PROD barrier dropped: a producer thread converts rows another warp's copies have not landed in yet"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="code + kCodeBlock * k + half * 32 * 64",
         new="code + kCodeBlock * k + half * 16 * 64",
         tests=[SELECTION], gpu=True,
         why="wrong code-block offset: rows 32-63 of the tile converted from the codes of rows 16-47"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="  if (lane < 16) valid[16 * pw + lane] = off >= 0;",
         new="  if (lane < 16) valid[16 * pw + lane] = 1;",
         tests=[SELECTION], gpu=True,
         why="flag ignored by the producer: a zero-filled slot (-1, past the length or the cache) scores 0, a key"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="slot_index(idx, slot0 + (i + 2) * kKeys, end)",
         new="slot_index(idx, slot0 + (i + 1) * kKeys, end)",
         tests=[SELECTION], gpu=True,
         why="the index prefetch one tile short: every tile after the second gathers its predecessor's rows"),
    # fp8_ds_mla (656-byte rows): scales, RoPE, Q's RoPE fragments, P times the block scale (ds=True)
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="    s[n] = fmaf(scales[4 * key + j], acc[n], s[n]);",
         new="    s[n] = fmaf(scales[4 * key], acc[n], s[n]);",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="wrong scale index in S: every block's partial dot times block 0's scale"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="kDsScales = 512, kDsRope = 528;",
         new="kDsScales = 512, kDsRope = 512;",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="wrong RoPE offset: the key's RoPE values read from the scale bytes and the next 112"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="    qr[ks][2] = lo[c + 4];",
         new="    qr[ks][2] = lo[c];",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="wrong Q RoPE fragment: columns c + 8, c + 9 of the low row replaced by c, c + 1"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="        scaled_fragments(sc, ssc, 0, 1, t, a[1]);",
         new="        scaled_fragments(sc, ssc, 0, 0, t, a[1]);",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="wrong P*scale block: warpgroup 0's own P for V's block 1 scaled by block 0's scales"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="e[n + 1] * scales[4 * (key + 1) + j]",
         new="e[n + 1] * scales[4 * key + j]",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="wrong P*scale key: the odd key's P scaled by its even neighbour's scale"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="        scaled_fragments(e0, ssc, 0, 3, t, a[1]);",
         new="        scaled_fragments(e0, ssc, 32, 3, t, a[1]);",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="warpgroup 1 scales warpgroup 0's P by the scales of its own keys (32..63) for block 3"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="reinterpret_cast<const float*>(sscale + 16 * kKeys * s);",
         new="reinterpret_cast<const float*>(sscale);",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="consumers read stage 0's scales for every tile: odd tiles use their predecessor's"),
    # 576-byte rows on f16 operands: every producer of an operand must write the type the wgmma reads
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="  e4m3x16_to<T>(w, lo, hi);",
         new="  e4m3x16_to<__nv_bfloat16>(w, lo, hi);",
         tests=[SELECTION], gpu=True,
         why="type mismatch: the in-place conversion writes bf16 bits that the f16 wgmma reads as f16 (K and V)"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="    e4m3x16_to<Elem<kDs>>(*reinterpret_cast<const uint4*>(src + r * kDim + 16 * c), lo, hi);",
         new="    e4m3x16_to<__nv_bfloat16>(*reinterpret_cast<const uint4*>(src + r * kDim + 16 * c), lo, hi);",
         tests=[SELECTION], gpu=True,
         why="Q left in bf16: the query's slabs hold bf16 bits while S runs on f16"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="        p_fragments<Elem<kDs>>(sc, a[0]);\n        store_p(sp, a[0], row_lo, 32, t);",
         new="        p_fragments<__nv_bfloat16>(sc, a[0]);\n        store_p(sp, a[0], row_lo, 32, t);",
         tests=[SELECTION], gpu=True,
         why="P1 rounded to bf16 bits while P V reads f16 (warpgroup 1's half of every tile)"),
    # round (s): the producer's row bases (one select a row, chunk offsets as immediates) and its index prefetch
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="  int32_t next = lane < 16 ? slot_index(idx, slot0 + kKeys, end) : -1;",
         new="  int32_t next = lane < 16 ? slot_index(idx, slot0, end) : -1;",
         tests=[SELECTION], gpu=True,
         why="the first prefetch at tile 0: tile 1 gathers tile 0's rows again"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="  const uint32_t n_a = off_a >= 0 ? 16u : 0u, n_b = off_b >= 0 ? 16u : 0u;",
         new="  const uint32_t n_a = 16u, n_b = off_b >= 0 ? 16u : 0u;",
         tests=[SELECTION], gpu=True,
         why="no zero fill for a slot that is not a key (rows a): it copies the cache's first row (NaN codes where no "
             "valid slot names it), and 0 * NaN in P V"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="row_a + kDsRope + 16 * (c - q), n_a);",
         new="row_a + kDsRope + 16 * c, n_a);",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="RoPE source of rows a not corrected for the lane's 16 q bytes: chunks 1-3 of the quad read 16 q too far"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="(q ? row_b : row_a) + kDsScales - 16 * q",
         new="(q ? row_b : row_a) + kDsScales",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="rows b's scales read 16 bytes late (from the RoPE values)"),
    dict(file="csrc/hopper.cuh",
         old="  lo = __byte_perm(__float_as_uint(a.x), __float_as_uint(a.y), 0x7632);",
         new="  lo = __byte_perm(__float_as_uint(a.y), __float_as_uint(a.x), 0x7632);",
         tests=[DS_SELECTION], gpu=True, ds=True,
         why="the bf16 widening swaps codes 0 and 1 of every 4 (fp8_ds_mla keys and values)"),
]


if __name__ == "__main__":
    import os
    import shlex
    import sys
    from pathlib import Path

    import gpu_mutants
    work = Path(os.environ.get("MUTANT_WORK", "/tmp/mla_core_sparse_mutants"))
    chosen = [m for m in MUTANTS if m.get("ds")] if os.environ.get("SPARSE_MUTANTS") == "ds" else MUTANTS
    raise SystemExit(gpu_mutants.run(chosen, lambda m: shlex.split(m["tests"][0]), work=work,
                                     prepare_only="--prepare" in sys.argv))
