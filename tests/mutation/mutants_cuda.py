"""Mutants of the CUDA decode (csrc/mla_decode.cu, backends/cuda): each is one plausible bug the GPU tests
must notice. ``old`` occurs exactly once in ``file``; ``new`` replaces it.

On a GPU machine, ``python3 tests/mutation/mutants_cuda.py`` judges every mutant with its own ``tests`` (as
tests/mutation/run.py does; the runner: gpu_mutants.py), printing killed / SURVIVED per mutant; ``MUTANT_SELECTION=qdq``
(or ``wgmma``, ``fp8cache``, ``q1``, ``keysm``, ``ring4``, ``tma``, ``kfp8tma``, ``layerprep``, ``quick``) judges every chosen mutant
with ``QDQ_SELECTION`` (``WGMMA_SELECTION``, ``FP8_CACHE_SELECTION``, ``Q1_SELECTION``, ``KEYS_M_SELECTION``,
``RING4_SELECTION``, ``TMA_SELECTION``, ``KFP8_TMA_SELECTION``, ``LAYER_PREP_SELECTION``, ``KILL_SELECTION``) instead; ``MUTANT_INDICES=16,17``
only those mutants.
"""
from __future__ import annotations

KILL_SELECTION = ("tests/test_cuda_decode.py", "-k",
                  "(deepseek and 16-16) or heads_and_out or calibrated or fp16_cache or index_dtypes")
"""What each mutant runs: fast cases that cover every recipe, split counts, CTA shapes and edges."""
WGMMA_SELECTION = "tests/test_cuda_decode.py -k 'every_config or (deepseek and bf16-128-16)'"
"""The WGMMA kernel's mutants (tests/mutation/run.py): every config at 64/128 heads, the DeepSeek edges at page 16."""
QDQ_SELECTION = ("tests/test_cuda_decode.py -k 'calibrated or (deepseek and fp8-16-16) or "
                 "(deepseek and fp8_p_nvfp4-128-16) or heads_and_out'")
"""The WGMMA kernel's fake-quantization mutants: FP8 K/V with calibrated amaxes, FP8 P, NVFP4 P at 16 and 128 heads."""
Q1_SELECTION = "tests/test_cuda_decode.py -k '(deepseek and bf16) or heads_and_out or (fp16_cache and bf16)'"
"""Schedule Q1's mutants (the unquantized WGMMA problem): bf16 at 16 / 64 / 128 heads, every page size and split
count; the head-group edges and padding (1-128 heads); fp16."""
FP8_CACHE_SELECTION = ("tests/test_cuda_decode.py -k 'fp8_cache_codes_exact or fp8_cache_unaligned or "
                       "fp8_cache_fp16_q or fp8_cache_few_heads or (test_fp8_cache and 16-16-3) or "
                       "(test_fp8_cache and 16-33-3)'")
"""The FP8 KV cache's mutants: every code exact and the byte path (16 heads: the keys-as-M kernel, 128: the 64-head
one), fp16 q and P qdq, 1-16 heads over odd / even step counts, the edges at 16 heads, pages 16 and 33 (33: a
producer warp's rows across pages, copied row by row)."""
RING4_SELECTION = "tests/test_cuda_decode.py -k 'ring4'"
"""Schedule Q1 on four 32-key ring slots ({"kernel": "ring4"}, round p): 64 / 65 / 128 heads, pages 16 / 33 / 64,
every tile edge, 1-32 splits; bit-equality with the default config; absent keys, unaligned rows, a CUDA graph. Its
own code is the ring's barriers: a broken one deadlocks (killed by MUTANT_TIMEOUT), gives wrong numbers, or launches
another kernel (the fixture's record)."""
TMA_SELECTION = "tests/test_cuda_decode.py -k 'tma_boxes or (odd_page_sizes and 48) or (deepseek and bf16-128-64-auto)'"
"""The producer's TMA boxes (round r): pages 16 / 32 / 64 / 256 and pages padded apart, lengths ending inside a warp's
16 rows, page 48 (no power of two: no TMA), 64 and 128 heads."""
KFP8_TMA_SELECTION = ("tests/test_cuda_decode.py -k 'fp8_recipe_tma_boxes or fp8_recipe_tma_landed_phase or "
                      "(deepseek and fp8-16-16) or "
                      "(deepseek and fp8_p_nvfp4-128-64)'")
"""K = V FP8 on the producer's TMA boxes (round s, mutants 76-79): the TMA path bit-equal to the unaligned cache's
element path at pages 16 / 64 (a page outside the cache in mid-request: one warp of one step falls back), page 33,
64 and 128 heads; every request's second page absent over a cache beyond the L2 (later TMA steps on the fallback's
stage must wait for their own boxes); the DeepSeek edges at page 16 (16 heads) and page 64 (128 heads, NVFP4 P)."""
KEYS_M_SELECTION = "tests/test_cuda_decode.py -k 'keys_m_fp16 or keys_m_metadata'"
"""The keys-as-M kernel over a bf16 / fp16 cache ({"kernel": "keys_m"}): fp16 and bf16, odd and even step counts, one
step, an empty split, pages of 48 at 1 and 16 heads, 1-32 splits; absent keys, unaligned rows, a CUDA graph."""
LAYER_PREP_SELECTION = "tests/test_layer_cuda_prep.py -k 'gpu_cuda_prep'"
"""The layer's CUDA prep (csrc/mla_layer_prep.cu, mutants 57-65): bit-equality against the Triton prep at 16 and 128
heads, pages 64 and 37, batch 1 and 3, the layouts (fp16, split halves, float32 gamma, int64 indices, sinks, padded
q heads) and pages outside the cache."""

MUTANTS = [
    dict(file="csrc/mla_decode_mma.cuh",
         old="  if (tok < hi) {  // only table entries a length reaches are read",
         new="  if (tok <= hi) {  // only table entries a length reaches are read",
         tests=["tests/test_cuda_decode.py"],
         why="off by one at a split's end: the row at the length (NaN in the tests' caches) is read as a key"),
    dict(file="csrc/mla_decode_mma.cuh",
         old="      const bool v0 = valid[key] != 0, v1 = valid[key + 1] != 0;",
         new="      const bool v0 = true, v1 = valid[key + 1] != 0;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong mask: absent keys (past the length, pages outside the cache) score 0 instead of -inf"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old="float(call.softmax_scale) * k32 * math.log2(math.e)",
         new="float(call.softmax_scale) * math.log2(math.e)",
         tests=["tests/test_cuda_decode.py"],
         why="wrong scale: the per-tensor K factor left out of the scores (only visible with a K amax)"),
    dict(file="csrc/mla_decode_mma.cuh",
         old="        p.part_lse[row * p.num_splits + split] = lse;",
         new="        p.part_lse[row * p.num_splits] = lse;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong index: every split writes its LSE to split 0's slot (the others stay poisoned)"),
    dict(file="csrc/mla_decode_split.cuh",
         old="  return {lo, lo + tiles_per_split * p_tile < len ? lo + tiles_per_split * p_tile : len};",
         new="  return {lo, lo + tiles_per_split * p_tile < len ? lo + tiles_per_split * p_tile : len - 1};",
         tests=["tests/test_cuda_decode.py"],
         why="off by one at the length: the last key of every request is dropped (both decode kernels)"),
    dict(file="csrc/mla_decode_mma.cuh",
         old="        acc[mt][nt][2] *= a1;",
         new="        acc[mt][nt][2] *= a0;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong row: the accumulator of heads g + 8 rescaled by row g's running-max factor"),
    dict(file="csrc/qdq.cuh",
         old="  r = r > 6.f ? 6.f : r;",
         new="  r = r > 4.f ? 4.f : r;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong E2M1 saturation (4 instead of 6): NVFP4 K/V/P values at the top of a block clip"),
    dict(file="csrc/mla_decode.cu",
         old="      total += w[j];",
         new="      total += 1.f;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong combine weight: splits merged with a plain count instead of their log-sum-exp weights"),
    dict(file="csrc/mla_decode_mma.cuh",
         old="        for (int c = 0; c < kRowCols; ++c) x[c] = to_float(from_float<T>(x[c]));",
         new="        for (int c = 0; c < kRowCols; ++c) x[c] = x[c];",
         tests=["tests/test_cuda_decode.py"],
         why="NVFP4 P not rounded to V's dtype first (the contract's order): block maxima and ties move"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  if (tok >= hi) return -1;",
         new="  if (tok > hi) return -1;",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, wrong mask at the length edge: the row at a split's end (NaN past a length) is a key"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      rescale_pv_slab<T>(o, a2_lo, a2_hi, sp, sv, 32);",
         new="      rescale_pv_slab<T>(o, 1.f, 1.f, sp, sv, 32);",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, warpgroup 0 skips the rescale between the two 32-key halves: P0 V0 kept against m1"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      exponentiate(sc, m2_lo, m2_hi, sum_lo, sum_hi);",
         new="      exponentiate(sc, m1_lo, m1_hi, sum_lo, sum_hi);",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, half 1's P taken against m1 instead of the step's final max m2"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="(s_valid[4 * s + 2 * wg + 1] << 16)",
         new="(s_valid[4 * s + 2 * wg + 1] << 8)",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, wrong validity bits for keys 16-31 of each half (masked keys read, valid ones dropped)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  q = r >= page_size ? q + 1 : q;\n",
         new="",
         tests=["tests/test_cuda_decode.py -k odd_page_sizes"], gpu=True,
         why="WGMMA kernel, a page size that is no power of two: the reciprocal's quotient not corrected upward"),
    dict(file="csrc/seesaw.cuh",
         old="__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }",
         new="__device__ __forceinline__ float finite_or_zero(float m) { return m; }",
         tests=["tests/test_cuda_decode.py -k unchecked_metadata"], gpu=True,
         why="WGMMA kernel, a step whose first 32 keys are all absent: -inf - -inf gives NaN factors (csrc/seesaw.cuh: "
             "the sparse kernel's P takes the same rule)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  const bool store_hi = h0 + row_lo + 8 < p.heads;",
         new="  const bool store_hi = h0 + row_lo + 16 < p.heads;",
         tests=["tests/test_cuda_decode.py -k 'every_config and 20'"], gpu=True,
         why="WGMMA kernel, padded head group: real rows 12-15 of a 20-head group never stored (the poison stays)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="    for (int k = 0; k < 9; k += 3) {",
         new="    for (int k = 0; k < 6; k += 3) {",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, the producer's FP8 K conversion stops after 6 slabs (columns 384-575 stay raw)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="    const uint32_t a = sk + (16 * w + 4 * g) * 128 + 16 * lane;",
         new="    const uint32_t a = sk + (8 * w + 4 * g) * 128 + 16 * lane;",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, producer warps convert the wrong rows (some twice, some never)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  const float inv = __frcp_rn(p.p_scale);",
         new="  const float inv = __frcp_rn(p.k_scale);",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, P's quotient corrected from K's reciprocal: FP8 / NVFP4 P codes of the wrong scale"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="        const int j = 8 * (blk >> 1) + 2 * (blk & 1) + (i & 1) + 4 * (i >> 1);",
         new="        const int j = 8 * (blk & 1) + 2 * (blk >> 1) + (i & 1) + 4 * (i >> 1);",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, NVFP4 P: a block's scale applied to another block (row hi / keys 16-31 swapped)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="bmax[blk] = fmaxf(bmax[blk], __shfl_xor_sync(0xffffffffu, bmax[blk], d));",
         new="bmax[blk] = fmaxf(bmax[blk], __shfl_xor_sync(0xffffffffu, bmax[blk], 1));",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, NVFP4 P block amax over 2 threads of the quad (8 keys) instead of 4 (16 keys)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      unpack<T>(Wgmma<T>::pack(e[j], e[j + 1]), lo, hi);",
         new="      lo = e[j];\n      hi = e[j + 1];",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, NVFP4 P not rounded to V's dtype first (the contract's order): block maxima and ties move"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  const float num = KF != kNoQuant || PF != kNoQuant ? p.out_scale : 1.f;",
         new="  const float num = 1.f;",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, the output without v_scale * p_scale (the factors left out of the codes)"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old="math.log2(math.e) * kv,",
         new="math.log2(math.e),",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache: kv_scale left out of the scores (softmax over codes, not values)"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old="kv * v32 * p32, k_scale",
         new="v32 * p32, k_scale",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache: kv_scale left out of the output factor (outputs in code units)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      const int r = (lane >> 2) & 3;",
         new="      const int r = lane & 3;",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache producer: the rope chunks of a row group copied from the wrong rows"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="cache + off + 16 * (32 + (lane & 3))",
         new="cache + off + 16 * (31 + (lane & 3))",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache producer: the rope chunks read one chunk early (columns 496-559 as 512-575)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="    const uint32_t row = 16 * w + 4 * g + (lane >> 3);",
         new="    const uint32_t row = 16 * w + 4 * g + (lane >> 4);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache conversion: values stored to the wrong rows of the group (two rows never written)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="    const uint32_t dst = sk + slab_off(row, 16 * (lane & 7));",
         new="    const uint32_t dst = sk + row * 128 + 16 * (lane & 7);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache conversion: values stored unswizzled (wgmma reads the 128-byte-swizzled slab layout)"),
    dict(file="csrc/hopper.cuh",
         old="  lo = __byte_perm(__float_as_uint(a.x), __float_as_uint(a.y), 0x7632);",
         new="  lo = __byte_perm(__float_as_uint(a.x), __float_as_uint(a.y), 0x7610);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, bf16 q: the first code of a pair taken from the float32's lower half (0)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      sk[code_off(w, r >> 2) + (c >> 6) * kSlab + 64 * (r & 3) + (c & 63)]",
         new="      sk[code_off(w, r >> 2) + (c >> 6) * kSlab + 64 * (r >> 2) + (c & 63)]",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache producer, unaligned rows (byte path): codes of a group's rows to one row's place"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="a2_lo = sa2[row_lo], a2_hi = sa2[row_lo + 8];",
         new="a2_lo = sa1[row_lo], a2_hi = sa1[row_lo + 8];",
         tests=[Q1_SELECTION], gpu=True,
         why="Q1: WG1 rescales O_R by a1 twice (a2 never applied where a row's maximum rose in the second half)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      const float x1 = (v1 >> key) & 1u ? s1[j] * p.qk_scale_log2 : -INFINITY;",
         new="      const float x1 = (v0 >> key) & 1u ? s1[j] * p.qk_scale_log2 : -INFINITY;",
         tests=[Q1_SELECTION], gpu=True,
         why="Q1: keys 32-63 masked with keys 0-31's validity (absent keys past a length score as real ones)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='  return (L & ~63) + 16 * ((x & 7) >> 1) + 4 * ((L >> 4) & 3) + (x & 1) + 2 * (x >> 3);',
         new='  return (L & ~63) + 16 * ((x & 7) >> 1) + 4 * ((L >> 4) & 3) + (x & 1);',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: Q^T's columns 2q + 8, 2q + 9 of a k16 step staged from 2q, 2q + 1's"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='  return (pk & ~15) + 2 * q + (j & 1) + 8 * (j >> 1);',
         new='  return (pk & ~15) + 2 * q + (j & 1) + 4 * (j >> 1);',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: P^T's load slots 2, 3 of a thread written to the wrong logical keys"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='      const uint32_t sel = (mt & 1) ? 0x7362u : 0x5140u;',
         new='      const uint32_t sel = (mt & 1) ? 0x5140u : 0x7362u;',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: V's byte transposition picks the other M tile's columns"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='    o[j] = o[j] * f0[k] + ot[j * 128 + t] * f1[k];',
         new='    o[j] = o[j] * f0[k] + ot[j * 128 + t];',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: warpgroup 1's output merged without its factor 2^(m1 - max)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='    const float lt = l0 * f0[k] + l1 * f1[k];',
         new='    const float lt = l0 * f0[k] + l1;',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: warpgroup 1's row sum merged without its factor"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='    const bool ok_lo = (vb >> g) & 1u, ok_hi = (vb >> (g + 8)) & 1u;',
         new='    const bool ok_lo = (vb >> g) & 1u, ok_hi = (vb >> g) & 1u;',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: keys 16w + g + 8 masked by key 16w + g's bit (keys past a length score 0)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='    for (int j = 0; j < 64; ++j) o[j] *= a[((j & 7) >> 2) * 2 + (j & 1)];',
         new='    for (int j = 0; j < 64; ++j) o[j] *= a[j & 3];',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel: O^T rescaled by the wrong heads' factors (km_rescale, shared with the "
             "bf16 keys-as-M kernel)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='      dst[r * kDim + c] = off >= 0 ? cache[off + c] : 0;',
         new='      dst[r * kDim + (c ^ 1)] = off >= 0 ? cache[off + c] : 0;',
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why='FP8 cache, keys-as-M kernel, unaligned rows (byte path): adjacent codes swapped'),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="lane >= 16 || (my_off >= 0 && my_off == off0 + lane * kDim));",
         new="lane >= 16 || my_off >= 0);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel producer: 16 present rows copied as one run though not contiguous"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      bulk_copy(dst + lane * kDim, cache + my_off, kDim, full);",
         new="      bulk_copy(dst + (lane & ~1) * kDim, cache + my_off, kDim, full);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel producer, rows copied one by one: odd rows land on the even row before"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="st_shared16(row + 16 * c, make_uint4(0u, 0u, 0u, 0u));",
         new="st_shared16(row + 16 * c, make_uint4(0x7f7f7f7fu, 0u, 0u, 0u));",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel producer: absent rows filled with NaN codes, not zeros (0 x NaN in P V)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="pv_flip = (q & 1) ? kDim : 0u;",
         new="pv_flip = 0u;",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel, P·V: odd q's rows not swapped while t_pkey expects them swapped"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      v[2] = ld_shared16(be + (16 * (u + 1) + 2) * kDim);",
         new="      v[2] = ld_shared16(bo + (16 * (u + 1) + 2) * kDim);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel, P·V: steps 1-3's slot 2 loaded through the odd slots' base (odd q: row 1)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  const int s = min(max(142 - static_cast<int>(bits >> 7), -113), 126);",
         new="  const int s = min(max(143 - static_cast<int>(bits >> 7), -113), 126);",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel, bf16 q on f16: a head's largest |q| scaled past f16's range (inf)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="      if constexpr (!std::is_same_v<T, __half>) y *= hs[k];  // exact: back to q's scale",
         new="",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel, bf16 q on f16: scores left at Q^T's per-head scale 2^s"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="        if (lane == 0) atomicMax(qmax + h, mw);",
         new="        if (lane == 0) qmax[h] = mw;",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel, bf16 q on f16: a head's scale from one warp's 32 pairs, not all 288"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  for (int j = 0; j < 8; ++j) sc[j] += s1[j];",
         new="  for (int j = 0; j < 8; ++j) sc[j] += 0.f * s1[j];",
         tests=[FP8_CACHE_SELECTION], gpu=True,
         why="FP8 cache, keys-as-M kernel, S^T: the odd 64-column blocks' accumulator not added (scores miss 256 of "
             "576 columns)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old='bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, "\n                 "1, 1, 1, 0;\\n"',
         new='bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, "\n                 "1, 1, 0, 0;\\n"',
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernel, bf16 O^T = V^T P^T: the transpose-A bit off (V's rows read as K-major V^T)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="km_wgmma_vt<T>(d, mnmajor_desc(sk + mt * kSlab, 16 * u), t_desc(my_pt, 32 * u));",
         new="km_wgmma_vt<T>(d, make_desc(smem_u32(sk + mt * kSlab) + 16 * u * 128u, kSlab, 2048u), "
             "t_desc(my_pt, 32 * u));",
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernel, V^T's descriptor: the stride of 8 keys (SBO) 2048 B instead of 1024"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="    const float m1 = smx[kHeadsT + hk], mt = fmaxf(m[k], m1), zt = finite_or_zero(mt);",
         new="    const float m1 = smx[hk], mt = fmaxf(m[k], m1), zt = finite_or_zero(mt);",
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernels' merge (km_merge): warpgroup 1's softmax rescaled by warpgroup 0's running max"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="    const bool ok_lo = vb & 1u, ok_hi = (vb >> 8) & 1u;",
         new="    const bool ok_lo = true, ok_hi = (vb >> 8) & 1u;",
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernel: the validity bit of keys 16 w + g ignored (absent keys score 0, not -inf)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="*reinterpret_cast<uint16_t*>(my_pt + t_off(hk, 2 * key)) =",
         new="*reinterpret_cast<uint16_t*>(my_pt + t_off(hk, 2 * (key ^ 8))) =",
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernel: P^T written at the wrong key (rows g and g + 8 swapped against V^T's keys)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="kmajor_desc(sk, 32 * ks), t_desc(sqt, 32 * ks), ks > 1);",
         new="kmajor_desc(sk, 32 * ks), t_desc(sqt, 32 * ks), ks > 2);",
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernel, S^T: the even chain restarts at k16 step 2 (columns 0-15 dropped from the scores)"),
    dict(file="csrc/mla_decode_wgmma.cuh",
         old="  const uint8_t* sk = sk0 + wg * kTileBytes;  // this warpgroup's stage",
         new="  const uint8_t* sk = sk0;  // this warpgroup's stage",
         tests=[KEYS_M_SELECTION], gpu=True,
         why="keys-as-M kernel: warpgroup 1 reads stage 0 (its steps' keys replaced by warpgroup 0's)"),
]


LAYER_PREP = "csrc/mla_layer_prep.cu"
# MUTANT_INDICES 57-63 (run.py ids cuda#58-64): the layer's CUDA prep (round m); each must fail a bit-equality test
MUTANTS += [
    dict(file=LAYER_PREP, old="for (int off = 16; off > 0; off >>= 1) s =",
         new="for (int off = 16; off > 1; off >>= 1) s =",
         tests=[LAYER_PREP_SELECTION], gpu=True,
         why="the warp's butterfly stops one step early: half the lanes' squares missing from the RMS"),
    dict(file=LAYER_PREP, old="  const int64_t col = pos / p.page_size;",
         new="  const int64_t col = (pos + 1) / p.page_size;",
         tests=[LAYER_PREP_SELECTION], gpu=True,
         why="off by one at a page edge: position 63 of page 64 (36 of 37) written into the next page"),
    dict(file=LAYER_PREP, old="const float sn = p.freqs[row * p.freqs_stride + 2 * lane + 1];",
         new="const float sn = p.freqs[row * p.freqs_stride + 2 * lane];", tests=[LAYER_PREP_SELECTION], gpu=True,
         why="the sine read from the cosine's column: every rotation wrong"),
    dict(file=LAYER_PREP, old="      if (h < p.heads) {",
         new="      if (h < p.heads - 1) {", tests=[LAYER_PREP_SELECTION], gpu=True,
         why="the last head's q_rope never rotated (the poisoned absorbed query keeps NaN there)"),
    dict(file=LAYER_PREP,
         old="b += __syncthreads_count(i < p.batch && load_index(p.offsets, p.offsets_i64, 1 + i) <= t);",
         new="b += __syncthreads_count(i < p.batch && load_index(p.offsets, p.offsets_i64, 1 + i) < t);",
         tests=[LAYER_PREP_SELECTION], gpu=True,
         why="the request search off by one: token t takes request t - 1's position and pages (batch 3)"),
    dict(file=LAYER_PREP, old="  const int p2 = p.interleave ? 2 * lane + 1 : lane + kHalf;",
         new="  const int p2 = p.interleave ? 2 * lane + 1 : lane + kHalf - 1;", tests=[LAYER_PREP_SELECTION], gpu=True,
         why="split halves: the second element of each pair one column early"),
    dict(file=LAYER_PREP, old="  if (tid == 0) p.tok_len[t] = static_cast<int32_t>(pos + 1);",
         new="  if (tid == 0) p.tok_len[t] = static_cast<int32_t>(pos);", tests=[LAYER_PREP_SELECTION], gpu=True,
         why="the key count one short: the new row is not attended to"),
    # MUTANT_INDICES 64 (run.py id cuda#65): the prep's head groups (round n)
    dict(file=LAYER_PREP, old="  const dim3 grid(p.tokens, (p.heads + kHeadsPerCta - 1) / kHeadsPerCta);",
         new="  const dim3 grid(p.tokens, 1);", tests=[LAYER_PREP_SELECTION], gpu=True,
         why="one head group launched: heads past the first 16 keep the poisoned absorbed query's rope columns"),
    # MUTANT_INDICES 65 (run.py id cuda#66): a partial last head group (round o)
    dict(file=LAYER_PREP, old="  const dim3 grid(p.tokens, (p.heads + kHeadsPerCta - 1) / kHeadsPerCta);",
         new="  const dim3 grid(p.tokens, p.heads / kHeadsPerCta);", tests=[LAYER_PREP_SELECTION], gpu=True,
         why="the head groups rounded down: a last group of fewer than 16 heads (or all of 1-15) never rotated"),
]

RING = "csrc/mla_decode_wgmma.cuh"
# MUTANT_INDICES 66-71 (run.py ids cuda#67-72): the four-slot ring, config ring4 (round p); 66-68 kill by deadlock
# (MUTANT_TIMEOUT) or wrong numbers, 69 by the ring4 fixture's launch record, 70-71 on the CPU
MUTANTS += [
    dict(file=RING, old="  const int h0 = kRing ? 2 * s : s, h1 = kRing ? 2 * s + 1 : s;",
         new="  const int h0 = kRing ? 2 * s : s, h1 = kRing ? 2 * s : s;", tests=[RING4_SELECTION], gpu=True,
         why="ring4: keys 32-63 waited and released on keys 0-31's slot (keys 0-31's slot released twice a step, "
             "keys 32-63's never: the producer pair of rows 32-63 waits forever at step 2, or reads race)"),
    dict(file=RING,
         old="        mbar_init(&full[i], kProducerThreads / 2);  // the two producer warps of the slot's half",
         new="        mbar_init(&full[i], kProducerThreads);  // the two producer warps of the slot's half",
         tests=[RING4_SELECTION], gpu=True,
         why="ring4: a slot's full barrier counts all 128 producer threads though only its half's 64 arrive "
             "(no step ever published: deadlock)"),
    dict(file=RING, old="  uint64_t* empty = full + (kRing ? 4 : 2);",
         new="  uint64_t* empty = full + 2;", tests=[RING4_SELECTION], gpu=True,
         why="ring4: empty[0..1] laid over full[2..3] (slots 2-3's barriers corrupted: deadlock or unwaited reads)"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old='        entry, args, layer = "decode_wgmma", args + (False, True), (3, 0, 0)',
         new='        entry, args, layer = "decode_wgmma", args + (False, False), (3, 0, 0)', tests=[RING4_SELECTION], gpu=True,
         why="ring4 launches the default 2-stage kernel (bit-equal, so only the launch record shows it)"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old='    return problem["heads"] >= 64 and _unquantized_16bit(problem)',
         new='    return problem["heads"] > 64 and _unquantized_16bit(problem)',
         tests=["tests/test_cuda_build.py"], why="ring4 not listed for the autotuner at 64 heads"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old='        entry, args, layer = "decode_wgmma", args + (False, True), (3, 0, 0)',
         new='        entry, args, layer = "decode_wgmma", args + (False, True), (1, 0, 0)',
         tests=["tests/test_cuda_decode_plan.py -k layer_decode_runs_the_configs_kernel"],
         why="the fused layer's decode runs the default WGMMA kernel for a ring4 plan (layer_decode kernel 1, not 3)"),
]

TMA = "csrc/mla_decode_wgmma.cuh"
# MUTANT_INDICES 72-75 (run.py ids cuda#73-76): the producer's TMA boxes (round r), killed by wrong numbers or NaN
MUTANTS += [
    dict(file=TMA, old="    for (int c = 0; c < kChunks / 8; ++c) tma_slab(sk + c * kSlab + 16 * w * 128, kv_map, 64 * c, in_page, page, bar);",
         new="    for (int c = 0; c < kChunks / 8; ++c) tma_slab(sk + c * kSlab + 16 * w * 128, kv_map, 64 * c, in_page + 1, page, bar);",
         tests=[TMA_SELECTION], gpu=True, why="TMA: the warp's rows one row late (the last one past its page: zeros)"),
    dict(file=TMA, old="    for (int c = 0; c < kChunks / 8; ++c) tma_slab(sk + c * kSlab + 16 * w * 128, kv_map, 64 * c, in_page, page, bar);",
         new="    for (int c = 0; c < kChunks / 8; ++c) tma_slab(sk + c * kSlab + 16 * w * 64, kv_map, 64 * c, in_page, page, bar);",
         tests=[TMA_SELECTION], gpu=True, why="TMA: warp w's rows land at row 8w (warps overwrite each other's rows)"),
    dict(file=TMA, old="  if (!__all_sync(0xffffffffu, lane >= 16 || my_off >= 0)) return false;",
         new="  if (!__all_sync(0xffffffffu, lane >= 1 || my_off >= 0)) return false;",
         tests=[TMA_SELECTION], gpu=True,
         why="TMA: only the warp's first row checked (rows past the length or on absent pages read: NaN)"),
    dict(file=TMA, old="  if (!wanted || p.cache_fp8 || p.page_shift < 0 || p.page_size < 16",
         new="  if (!wanted || p.cache_fp8 || p.page_size < 16", tests=[TMA_SELECTION], gpu=True,
         why="TMA maps a page size that is no power of two (48: the in-page row by a mask is wrong)"),
]
# MUTANT_INDICES 76-79 (run.py ids cuda#77-80): K = V FP8 on the TMA boxes (round s), killed by wrong numbers (the
# TMA path against the element path, bit for bit) or a launch error
KFP8_WAIT = "          mbar_wait(&landed[4 * s + (warp - 8)], (landed_par >> s) & 1);\n"
MUTANTS += [
    dict(file=TMA, old=KFP8_WAIT, new=KFP8_WAIT.replace("(landed_par >> s) & 1", "(i >> 1) & 1"),
         tests=[KFP8_TMA_SELECTION], gpu=True,
         why="K FP8 TMA: the landed wait at the step's parity; after a warp's fallback step (a page outside the cache) "
             "its later waits pass at once and convert rows before their boxes land"),
    dict(file=TMA, old=KFP8_WAIT, new="", tests=[KFP8_TMA_SELECTION], gpu=True,
         why="K FP8 TMA: no landed wait (the rows converted while the boxes land; unconverted values reach the MMA)"),
    dict(file=TMA, old="        k_codes_fp8<T>(p.k_scale, k_inv, smem_u32(sk0 + s * kTileBytes), warp - 8, lane);",
         new="        k_codes_fp8<T>(p.k_scale, k_inv, smem_u32(sk0 + s * kTileBytes), (warp - 7) & 3, lane);",
         tests=[KFP8_TMA_SELECTION], gpu=True,
         why="K FP8: each warp converts the next warp's rows (its own stay unconverted, the next one's converted twice "
             "or before they land)"),
    dict(file=TMA, old="  const bool kv_tma = kv_tensor_map(p, KF == kNoQuant || KF == kFP8, &kv_map);",
         new="  const bool kv_tma = kv_tensor_map(p, KF == kNoQuant, &kv_map) || KF == kFP8;",
         tests=[KFP8_TMA_SELECTION], gpu=True,
         why="K FP8 launcher: the kernel told to load by TMA without a map (a zeroed descriptor: a launch error; not "
             "asking for the map at all would be a no-op for the results)"),
]

WG0 = "csrc/mla_decode_wgmma.cuh"
# MUTANT_INDICES 80-82 (run.py ids cuda#81-83): WG0's cheaper Q1 chain (round t, benchmarks/NOTES.md "WG0's Q1
# chain made cheaper"): P by stmatrix, the all-valid fast path, the factors by st.shared; each killed by wrong
# numbers in Q1_SELECTION (bf16 at 16 / 64 / 128 heads, ragged lengths, pages)
MUTANTS += [
    dict(file=WG0, old="  const uint32_t row = 16u * (t >> 5) + (lane & 7) + 8u * ((lane >> 3) & 1);",
         new="  const uint32_t row = 16u * (t >> 5) + (lane & 7) + 8u * ((lane >> 4) & 1);", tests=[Q1_SELECTION],
         gpu=True, why="stmatrix: matrices 1 / 2 addressed as each other (rows hi, keys 0-7 <-> rows lo, keys 8-15): "
                       "WG1 multiplies a scrambled P (every case)"),
    dict(file=WG0, old="    if ((v0 & v1) == 0xffffffffu) {", new="    if (v0 == 0xffffffffu) {", tests=[Q1_SELECTION],
         gpu=True, why="the all-valid fast path tested on keys 0-31 only: a ragged last step with 32-63 valid keys "
                       "scores its absent keys 32-63 unmasked (the tests' NaN / garbage rows, or zeros, leak in)"),
    dict(file=WG0, old="      st_shared4f(smem_u32(sa1 + row_lo + 8), a1_hi);",
         new="      st_shared4f(smem_u32(sa1 + row_lo + 8), a1_lo);", tests=[Q1_SELECTION], gpu=True,
         why="WG1's factor a1 of rows hi published as row lo's (wrong whenever the two rows' maxima move apart)"),
]

MANY_SPLITS_SELECTION = "tests/test_cuda_decode.py -k 'many_splits or auto_fills_the_gpu'"
"""64 / 128 splits (numerics.MAX_KV_SPLITS, issue 9): WGMMA, keys-as-M, mma.sync, an FP8 cache, "auto" at batch 1."""
# MUTANT_INDICES 83-84 (run.py ids cuda#84-85): the split cap raised from 32 to 128 (docs/decisions.md "Decode splits
# up to 128"); each shows only above 32 splits
MUTANTS += [
    dict(file="csrc/mla_decode.cu",
         old="  const float lse_t = t < splits ? p.part_lse[row * splits + t] : -INFINITY;",
         new="  const float lse_t = t < splits && t < 32 ? p.part_lse[row * splits + t] : -INFINITY;",
         tests=[MANY_SPLITS_SELECTION], gpu=True,
         why="the combine merges only the first 32 splits (a leftover fixed bound of the old cap): above 32 splits the "
             "later keys drop out of out and LSE (every kernel's combine; invisible at 1-32 splits)"),
    dict(file="csrc/bindings.cpp",
         old='MLA_CHECK(num_splits >= 1 && num_splits <= 128, "num_splits must be 1..128");',
         new='MLA_CHECK(num_splits >= 1 && num_splits <= 32, "num_splits must be 1..128");',
         tests=[MANY_SPLITS_SELECTION], gpu=True,
         why="the binding refuses what validation accepts (33-128 splits: a RuntimeError from the extension)"),
]

# MUTANT_INDICES 85 (run.py id cuda#86): the combine launched with programmatic stream serialization (round u)
MUTANTS += [
    dict(file="csrc/mla_decode.cu",
         old='  asm volatile("griddepcontrol.wait;" ::: "memory");\n',
         new="",
         tests=[MANY_SPLITS_SELECTION], gpu=True,
         why="the combine reads the partials without waiting for the split grid: its CTAs start as soon as every "
             "split CTA has run griddepcontrol.launch_dependents, long before their partials are written"),
]

if __name__ == "__main__":
    import os
    import shlex

    import gpu_mutants
    # MUTANT_SELECTION names one selection for every chosen mutant (module docstring); unset: each mutant's own tests
    chosen = {"wgmma": WGMMA_SELECTION, "qdq": QDQ_SELECTION, "fp8cache": FP8_CACHE_SELECTION, "q1": Q1_SELECTION,
              "keysm": KEYS_M_SELECTION, "layerprep": LAYER_PREP_SELECTION, "ring4": RING4_SELECTION,
              "tma": TMA_SELECTION, "kfp8tma": KFP8_TMA_SELECTION, "quick": shlex.join(KILL_SELECTION)}.get(os.environ.get("MUTANT_SELECTION", ""))
    if chosen:
        raise SystemExit(gpu_mutants.run(MUTANTS, lambda m: shlex.split(chosen)))
    raise SystemExit(gpu_mutants.run(MUTANTS, lambda m: [a for t in m["tests"] for a in shlex.split(t)]))
