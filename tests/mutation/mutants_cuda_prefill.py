"""Mutants of the CUDA prefill (csrc/mla_prefill_wgmma.cu, mla_prefill_persistent.cu, mla_prefill_fp8.cu,
mla_prefill_nvfp4.cu, qdq.cuh's prefill quotients and what the kernels share in mla_prefill_common.cuh,
backends/cuda/mla_core_cuda/prefill.py): each is one plausible bug tests/test_cuda_prefill.py's GPU tests must
notice. ``old`` occurs exactly once in ``file``.

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
PREPASS_SELECTION = ("tests/test_cuda_prefill.py::test_gpu_fp8 "
                     "tests/test_cuda_prefill.py::test_gpu_qdq_prepass_codes_equal_the_numerics_definition "
                     "tests/test_cuda_prefill.py::test_gpu_q_codes_in_the_kernel_equal_the_prepass_codes")
"""The FP8 pre-pass's and the in-kernel Q codes' mutants (indices 8-13): codes bit for bit, the recipe end to end."""
FP8_MMA_SELECTION = ("tests/test_cuda_prefill.py::test_gpu_fp8_tile_images_byte_for_byte "
                     "tests/test_cuda_prefill.py::test_gpu_fp8_mma_boundary_lengths "
                     "tests/test_cuda_prefill.py::test_gpu_fp8_mma_cached_prefix_and_gqa "
                     "tests/test_cuda_prefill.py::test_gpu_fp8_mma_factors_outside_the_division_free_range")
"""The FP8-wgmma config's mutants (indices 14-22): its tile images byte for byte, then the config against the
reference on tile-edge lengths, cached prefixes with GQA, and factors outside the division-free range."""
NVFP4_SELECTION = ("tests/test_cuda_prefill.py::test_gpu_nvfp4_prepass_values_equal_the_numerics_definition "
                   "tests/test_cuda_prefill.py::test_gpu_nvfp4_p_blocks_are_the_reference_blocks "
                   "tests/test_cuda_prefill.py::test_gpu_nvfp4_boundary_lengths "
                   "tests/test_cuda_prefill.py::test_gpu_nvfp4_cached_prefix_and_gqa "
                   "tests/test_cuda_prefill.py::test_gpu_nvfp4_q_in_the_kernel_equals_the_prepass_values")
"""The nvfp4 recipe's mutants (indices 23-39): the pre-pass's values bit for bit, P's blocks against the reference,
then the recipe end to end on tile-edge lengths and cached prefixes with GQA, and the kernel's Q values against the
pre-pass's bit for bit."""
PERSISTENT_SELECTION = ("tests/test_cuda_prefill.py::test_gpu_persistent_boundary_lengths_bit_equal "
                        "tests/test_cuda_prefill.py::test_gpu_persistent_gqa_cached_prefix_and_mostly_empty_blocks "
                        "tests/test_cuda_prefill.py::test_gpu_persistent_nan_and_inf_rows_between_sequences "
                        "tests/test_cuda_prefill.py::test_gpu_persistent_counter_zeroed_per_call_and_graph_capture")
"""The persistent config's mutants (indices 40-47): bit-equal to the default config at ragged lengths (0, 1, tile
edges; causal and not; GQA; mostly empty blocks), NaN / Inf rows past partial tiles, calls in a row and a graph.
Each changes results deterministically (no hang: the protocol's own mutants are the emulator's, part PERSISTENT of
benchmarks/probes/prefill_wgmma_emulation.py)."""

MUTANTS = [
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="for (int idx = lane; idx < (kBN - tail_keys) * 16; idx += 32)",
         new="for (int idx = lane; idx < 0; idx += 32)",
         tests=[SELECTION], gpu=True,
         why="tail guard dropped: V rows past a sequence's end (the next sequence's NaN / Inf) reach P·V as 0 · Inf"),
    dict(file="csrc/mla_prefill_common.cuh",
         old="if (key >= len_k || (causal && key > qr + off)) sc[e] = -INFINITY;",
         new="if (key >= len_k || (causal && key > qr + off + 1)) sc[e] = -INFINITY;",
         tests=[SELECTION], gpu=True,
         why="causal mask off by one: each query also sees the key after its diagonal"),
    dict(file="csrc/mla_prefill_common.cuh",
         old="const bool need_mask = key0 + kBN > len_k || (causal",
         new="const bool need_mask = (causal",
         tests=[SELECTION], gpu=True,
         why="no tail mask when non-causal: the next sequence's keys score in the last tile"),
    dict(file="csrc/mla_prefill_common.cuh",
         old="  return last_key < 0 ? 0 : last_key / kBN + 1;",
         new="  return last_key < 0 ? 0 : (last_key + 1) / kBN;",
         tests=[SELECTION], gpu=True,
         why="causal tile count one short when the block's last visible key opens a key tile"),
    dict(file="csrc/mla_prefill_common.cuh",
         old="  c.hk = c.h / (p.heads / p.kv_heads);",
         new="  c.hk = c.h % p.kv_heads;",
         tests=[SELECTION], gpu=True,
         why="wrong GQA head: query heads interleaved over kv heads instead of grouped (prefill::cta_start, shared "
             "with the FP8 prefill kernel)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="    if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) prefill::scale_rows64(o, a_lo, a_hi);\n",
         new="",
         tests=[SELECTION], gpu=True,
         why="no rescale of O when the running maximum grows: earlier tiles kept against the old maximum"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="        out_scale = f32(out_scale) * p_scale",
         new="        out_scale = f32(out_scale)",
         tests=[SELECTION], gpu=True,
         why="P's FP8 scale not applied to O: the codes' sum left 448x too large"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old='    scale_qk, out_scale = factor["q"] * factor["k"], factor["v"]',
         new='    scale_qk, out_scale = factor["q"], factor["v"]',
         tests=[SELECTION], gpu=True,
         why="K's FP8 scale left out of the score scale (Q / K codes multiplied as if scale 1)"),
    # 8-13: the fp8 recipe's pre-pass in one launch and Q's codes in the kernel (branch wip/prefill-fp8-prepass)
    dict(file="csrc/qdq.cuh",
         old="    return (a > 464.f || a < 0x1p-20f) ? q0 : q;",
         new="    return a > 464.f ? q0 : q;",
         tests=[PREPASS_SELECTION], gpu=True,
         why="division-free quotient without its low guard: x = -0 (and tiny negatives) get the code +0"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="    const int j = i < jobs.n8[0] ? 0 : (i < jobs.n8[0] + jobs.n8[1] ? 1 : 2);",
         new="    const int j = i < jobs.n8[0] ? 0 : 1;",
         tests=[PREPASS_SELECTION], gpu=True,
         why="one-launch pre-pass: a third operand's chunks written into the second's (V codes past K's end)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="    if (second) *ob = codes8<kExact>(wb, sb, rb);",
         new="",
         tests=[PREPASS_SELECTION], gpu=True,
         why="one-launch pre-pass: each thread's second chunk of a step loaded but never written"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="  for (int half = 0; half < 2; ++half) {",
         new="  for (int half = 0; half < 1; ++half) {",
         tests=[PREPASS_SELECTION], gpu=True,
         why="Q's codes in the kernel: half of each warpgroup's chunks left raw (the rows' later features)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="if (p.q_fmt == 1)\n      q_codes<false>",
         new="if (p.q_fmt == 2)\n      q_codes<false>",
         tests=[PREPASS_SELECTION], gpu=True,
         why="Q's codes in the kernel: the IEEE / division-free choice swapped (q_amax 1e-40: a subnormal factor, "
             "its reciprocal Inf, zeros become NaN without the division)"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="        q_fmt = 1 if EXACT_DIV_FREE_RANGE[0] <= q_scale",
         new="        q_fmt = 0 if EXACT_DIV_FREE_RANGE[0] <= q_scale",
         tests=[PREPASS_SELECTION], gpu=True,
         why="Q's codes not made: the kernel multiplies raw Q while its factor is folded into the score scale"),
    # 14-22: the fp8 recipe on FP8 wgmma (csrc/mla_prefill_fp8.cu, config {"mma": "fp8"})
    dict(file="csrc/mla_prefill_fp8.cu",
         old="  return (p & 32) + 8 * (2 * (q >> 4) + ((q >> 1) & 1)) + 2 * ((q >> 2) & 3) + (q & 1);",
         new="  return (p & 32) + q;",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="V^T's keys in plain order: P's fragments (S's register order) pair keys with other keys' V"),
    dict(file="csrc/mla_prefill_fp8.cu",
         old="        const int e = 16 * ks + 8 * (i >> 1) + 2 * (i & 1);",
         new="        const int e = 16 * ks + 4 * (i >> 1) + 2 * (i & 1);",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="P's A fragments a[2] / a[3] from the wrong S registers (keys 8 g + .. one group off)"),
    dict(file="csrc/mla_prefill_fp8.cu",
         old="    for (int ks = 0; ks < 2; ++ks) wgmma_pv8(ot, pa[ks], dv + static_cast<uint64_t>(ks * 2), ks > 0);",
         new="    for (int ks = 0; ks < 2; ++ks) wgmma_pv8(ot, pa[ks], dv + static_cast<uint64_t>(ks * 2), 1);",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="the fresh P·V accumulator not zeroed: each tile adds the previous tiles' P·V again"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="f32(v_scale) * p_scale,",
         new="f32(v_scale),",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="P's FP8 scale dropped from O's factor in the FP8-wgmma config"),
    dict(file="csrc/mla_prefill_fp8.cu",
         old="return r * 64 + ((((b >> 4) ^ (r >> 1)) & 3) << 4) + (b & 15); }",
         new="return r * 64 + (((b >> 4) & 3) << 4) + (b & 15); }",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="tile images and Q's codes written unswizzled while the descriptors read the 64-byte swizzle"),
    dict(file="csrc/mla_prefill_fp8.cu",
         old="__device__ __forceinline__ int first_slot(int start, int b) { return start / kBN + b; }",
         new="__device__ __forceinline__ int first_slot(int start, int b) { return start / kBN; }",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="image slots without the per-sequence +1: a sequence starting inside a tile overwrites the previous "
             "sequence's last tile"),
    dict(file="csrc/mla_prefill_fp8.cu",
         old="        bulk_copy(sstage + s * kImage, src + i * step, kImage, &full[s]);",
         new="        bulk_copy(sstage + s * kImage, src + i * kImage, kImage, &full[s]);",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="the producer steps through kv heads instead of key tiles (the next slot is kv_heads images away)"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="                       not (inside[0] and inside[3]))",
         new="                       not (inside[0] or inside[3]))",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="the kernel's division-free quotient for Q with a factor outside its range (q_amax 1e-40: reciprocal "
             "Inf, zero codes NaN)"),
    dict(file="csrc/mla_prefill_fp8.cu",
         old="    wv[u] = r < keys ? __ldg(",
         new="    wv[u] = r < kBN ? __ldg(",
         tests=[FP8_MMA_SELECTION], gpu=True,
         why="a partial tile's V rows past the sequence's end not zeroed: the next sequence's V (or past the "
             "tensor) enters V^T"),
    # 23-30: the nvfp4 recipe (round m): P's NVFP4 in the bf16-wgmma kernel, the pre-pass, the launcher
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="bf16x2_max_nonneg(odd ? k1 : k0, __shfl_xor_sync(0xffffffffu, odd ? k0 : k1, 1));",
         new="bf16x2_max_nonneg(odd ? k1 : k0, __shfl_xor_sync(0xffffffffu, odd ? k0 : k1, 4));",
         tests=[NVFP4_SELECTION], gpu=True,
         why="P's block maximum over the wrong lanes (other rows of the warp instead of the quad's keys)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="const uint32_t lo = bf16x2_max_nonneg(w[4 * ks], w[4 * ks + 2]);",
         new="const uint32_t lo = bf16x2_max_nonneg(w[4 * ks], w[4 * ks + 1]);",
         tests=[NVFP4_SELECTION], gpu=True,
         why="P's block of row lo takes row hi's values in place of its keys 8-15"),
    dict(file="csrc/mla_prefill_nvfp4.cu",
         old="__device__ __forceinline__ int64_t first_slot16(int start, int b) { return start / kBlock + b; }",
         new="__device__ __forceinline__ int64_t first_slot16(int start, int b) { return start / kBlock; }",
         tests=[NVFP4_SELECTION], gpu=True,
         why="V's block slots without the per-sequence +1: a sequence starting inside a 16-key block takes the "
             "previous sequence's last block (left unwritten)"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old='        ops["v"], factor["v"] = nvfp4_keys(module, ops["v"], cu_k, call.v_amax)',
         new='        ops["v"] = nvfp4_keys(module, ops["v"], cu_k, call.v_amax)[0]',
         tests=[NVFP4_SELECTION], gpu=True,
         why="V's global scale left out of the output scale"),
    dict(file="csrc/qdq.cuh",
         old='    if (e < n) asm("max.NaN.f32 %0, %0, %1;\\n" : "+f"(m) : "f"(fabsf(x[e])));',
         new="    if (e < n) m = fmaxf(m, fabsf(x[e]));",
         tests=[NVFP4_SELECTION], gpu=True,
         why="a block holding a NaN keeps its other values (fmaxf drops the NaN) instead of becoming all NaN"),
    dict(file="csrc/qdq.cuh",
         old="    return (a > 16.f || a < 0x1p-20f) ? q0 : q;",
         new="    return q;",
         tests=[NVFP4_SELECTION], gpu=True,
         why="the division-free NVFP4 quotient without its guard: Inf becomes NaN instead of saturating to 6"),
    dict(file="csrc/mla_prefill_nvfp4.cu",
         old="const int keys = static_cast<int>(min(static_cast<int64_t>(kBlock), len - i * kBlock));",
         new="const int keys = kBlock;",
         tests=[NVFP4_SELECTION], gpu=True,
         why="a sequence's last, partial V block takes the next sequence's keys into its maximum (and writes them)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="const int src = (lane & ~3) | (b >> 1);",
         new="const int src = (lane & ~3) | (b & 3);",
         tests=[NVFP4_SELECTION], gpu=True,
         why="P's block codes taken from the wrong owner lane of the quad (blocks 2q, 2q + 1 are lane q's)"),
    # 31-34: P's cheaper NVFP4 step (round n, pending): the reduce-scatter, 1 / s from the owner, the 5-instruction
    # E2M1 rounding
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="uint32_t k0 = upper ? pr[2] : pr[0], k1 = upper ? pr[3] : pr[1];",
         new="uint32_t k0 = upper ? pr[0] : pr[2], k1 = upper ? pr[1] : pr[3];",
         tests=[NVFP4_SELECTION], gpu=True,
         why="the quad's reduce-scatter keeps the pairs it sends (lane q ends with another lane's blocks' maxima)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="const float inv_s = kP == 3 ? __shfl_sync(0xffffffffu, own[b & 1].inv_s, src) : 1.f;",
         new="const float inv_s = kP == 3 ? __shfl_sync(0xffffffffu, own[(b & 1) ^ 1].inv_s, src) : 1.f;",
         tests=[NVFP4_SELECTION], gpu=True,
         why="P's division-free quotient with the other block's 1 / s (Markstein's one correction cannot repair it)"),
    # 33-34 re-pointed in round (o): kP 3's P no longer calls round_e2m1_nonneg (the pre-pass and kP 4 still do) but
    # round_e2m1_nonneg_unsat and the bf16 pair's clamp at 6; the same two bugs there
    dict(file="csrc/qdq.cuh",
         old="  const float e = __uint_as_float(__float_as_uint(fmaxf(x, 1.f)) & 0x7f800000u);",
         new="  const float e = __uint_as_float(__float_as_uint(fmaxf(x, 2.f)) & 0x7f800000u);",
         tests=[NVFP4_SELECTION], gpu=True,
         why="P's E2M1 rounding below 2 on the grid of [2, 4) (step 1: 0.5 and 1.5 never come out)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="bf16x2_min_nan(bf16x2_bits(v_lo, v_hi), 0x40c040c0u)",
         new="bf16x2_min_nan(bf16x2_bits(v_lo, v_hi), 0x41004100u)",
         tests=[NVFP4_SELECTION], gpu=True,
         why="P's E2M1 values clamped at 8 instead of 6 (quotients above 7: saturated or subnormal block codes)"),
    # 35-39: Q's NVFP4 values in the kernel (round n, wip/nvfuse), the pre-pass's signed 7-instruction rounding
    dict(file="csrc/mla_prefill_wgmma.cu",
         old=": \"r\"(sq + 32 * (t + 128 * (kQUnitsInFlight * round + u)) + 16 * c));",
         new=": \"r\"(sq + 32 * (t + 128 * (kQUnitsInFlight * round + u)) + 2048 * c));",
         tests=[NVFP4_SELECTION], gpu=True,
         why="Q's block in the kernel from two rows' chunks (16 rows apart) and stored back as one"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="kQUnitRounds = 6 / kQUnitsInFlight;",
         new="kQUnitRounds = 1;",
         tests=[NVFP4_SELECTION], gpu=True,
         why="Q's NVFP4 in the kernel: half of each warpgroup's blocks left raw (the bf16 values, not NVFP4)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="    if (kP >= 3 && p.q_fmt == 3)",
         new="    if (kP >= 4 && p.q_fmt == 3)",
         tests=[NVFP4_SELECTION], gpu=True,
         why="the division-free P instance (kP 3) lacks Q's NVFP4 step: q_fmt 3 falls through to Q's FP8 codes"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old='("q", call.q_quant if q_fmt == 0 else None)',
         new='("q", call.q_quant)',
         tests=[NVFP4_SELECTION], gpu=True,
         why="Q through the pre-pass and the kernel's NVFP4 step both: the values (without g) quantized a second time"),
    dict(file="csrc/qdq.cuh",
         old="  return x < 0.f ? -r : r;\n}\n\n// An NVFP4 value of the prefill",
         new="  return r;\n}\n\n// An NVFP4 value of the prefill",
         tests=[NVFP4_SELECTION], gpu=True,
         why="the Q / K / V E2M1 rounding drops the sign (|x|'s value for negative x)"),
    # 40-47: the persistent bf16 kernel (round n, wip/ppers): its scheduler, Q slots, ring and tail guard across items
    dict(file="csrc/mla_prefill_persistent.cu",
         old="nb = min((len_q + kBM - 1) / kBM, blocks);",
         new="nb = min(len_q / kBM, blocks);",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="the scheduler's block count rounds down: a sequence's partial last query block is never an item"),
    dict(file="csrc/mla_prefill_persistent.cu",
         old="if (lane == 0) w = atomicAdd(p.work_counter, 1ull);",
         new="if (lane == 0) w = atomicAdd(p.work_counter, 2ull);",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="each claim takes two items and runs one: every other item is skipped"),
    dict(file="csrc/mla_prefill_persistent.cu",
         old="const int hk = h / (p.heads / p.kv_heads);",
         new="const int hk = h % p.kv_heads;",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="the producer's GQA head: query heads interleaved over kv heads instead of grouped"),
    dict(file="csrc/mla_prefill_persistent.cu",
         old="const int h = item[kItemH], q_begin_seq = item[kItemQBegin], len_q = item[kItemLenQ];",
         new="const int h = item[kItemH], q_begin_seq = item[kItemQBegin], len_q = item[kItemLenK];",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="the consumers read len_k for len_q from the item's words: the causal offset and the stored rows are "
             "wrong wherever the two differ"),
    dict(file="csrc/mla_prefill_persistent.cu",
         old="      prefill::store_empty_rows(p.out, p.lse, p.total_q, p.heads, h, q_begin_seq, qrow_lo, len_q, t);\n",
         new="",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="an item without a visible key releases its Q slot but leaves its rows unwritten (0 / -inf expected)"),
    dict(file="csrc/mla_prefill_persistent.cu",
         old="for (int idx = lane; idx < (kBN - tail_keys) * 16; idx += 32)",
         new="for (int idx = lane; idx < 0; idx += 32)",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="the persistent kernel's tail guard dropped: the next sequence's NaN / Inf V rows reach P·V as 0 · Inf"),
    dict(file="csrc/mla_prefill_persistent.cu",
         old="    const uint32_t dq = static_cast<uint32_t>(kmajor_desc(sq + slot * kQSlotBytes + wg * kQWgBytes));",
         new="    const uint32_t dq = static_cast<uint32_t>(kmajor_desc(sq + wg * kQWgBytes));",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="every item's S reads Q slot 0: odd items use the even item's Q (or Q still landing)"),
    dict(file="backends/cuda/mla_core_cuda/prefill.py",
         old="counter = (torch.zeros(1, dtype=torch.int64, device=device),) if persistent else ()",
         new="counter = (torch.ones(1, dtype=torch.int64, device=device),) if persistent else ()",
         tests=[PERSISTENT_SELECTION], gpu=True,
         why="the item counter not zero at the launch: the first item (a sequence's longest block) never runs"),
    # 48-50: P's cheaper block scales (round o, wip/nvp): the pair conversion of the two codes, s of an empty block
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="const __half2 codes = round_e4m3x2(code_arg(b0), code_arg(b1));",
         new="const __half2 codes = round_e4m3x2(code_arg(b1), code_arg(b0));",
         tests=[NVFP4_SELECTION], gpu=True,
         why="the owner's two block codes swapped in the E4M3 pair conversion (block 2q gets 2q + 1's code)"),
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="const float s = c[i] == 0.f ? 1.f : c[i] * g;",
         new="const float s = c[i] * g;",
         tests=[NVFP4_SELECTION], gpu=True,
         why="an all-zero P block (masked keys) keeps s = 0: 1 / s = Inf, 0 · Inf = NaN values in the row's P·V"),
    # 50: the owner's two codes in one shuffled word (round o): block 2q + 1's values times its code
    dict(file="csrc/mla_prefill_wgmma.cu",
         old="mov.b32 %0, {h, h};",
         new="mov.b32 %0, {l, l};",
         tests=[NVFP4_SELECTION], gpu=True,
         why="each odd block's values multiplied by the even block's code (the shuffled word's wrong half)"),
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
