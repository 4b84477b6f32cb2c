"""A small decode workload for ``compute-sanitizer --tool memcheck`` (the kernels alone, no reference).

    compute-sanitizer --tool memcheck python3 -m mla_core_cuda.sanitize \
        [decode|ring4|sparse|prefill|prefill_nvfp4|prefill_persistent]

Runs every CTA shape and recipe (and the WGMMA kernel, ``shape="wgmma"``, unquantized, with the fp8 recipe and
with FP8 K/V + NVFP4 P: its in-place K conversion and P quantization; over an FP8 cache, ``fp8cache``; its
keys-as-M variant, ``shape="keys_m"``, bf16 at <= 16 heads; its four-slot ring, ``shape="ring4"``, bf16) on
paged caches whose unreached rows hold NaN, with block-table entries past
each length and within a length (content checks off) pointing outside the cache, lengths past the table's
capacity, page sizes 1 / 16 / 48 / 64, unaligned cache rows, and 1 / 3 / 32 / 128 splits. Prints one line per case
and exits 1 if any output holds NaN (the sanitizer reports memory errors itself; ``decode`` alone: only these).
Then the FP8 sparse decode
(``sparse`` alone: only it), 576- and 656-byte rows, on a cache of NaN bytes except the rows valid slots name, with
-1 slots, slots past each length naming rows past the cache and a NaN row, 2^31 - 1 within a length, 1 / 4 / auto
splits. Then the varlen prefill (``prefill`` alone: only it): ragged batches with empty and one-token sequences,
len_q < len_k (a cached prefix) and equal, causal and not, GQA, bf16, the fp8 recipe (both configs: the bf16
products and FP8 wgmma), the nvfp4 recipe (``prefill_nvfp4`` alone: only its cases) and the persistent bf16 kernel
(``prefill_persistent`` alone: only its cases), q / k / v packed inside buffers whose rows past the last sequence hold
NaN, LSE on.
"""
from __future__ import annotations

import os
import sys

import torch


def _case(heads, page_size, lengths, splits, recipe, shape, unaligned=False, seed=0):
    from mla_core.specs import validate_decode

    from . import build, decode
    g = torch.Generator(device="cuda").manual_seed(seed)
    dim = 576
    width = max(-(-n // page_size) for n in lengths) + 2
    pages = len(lengths) * width
    base = torch.full((pages, page_size, dim + (1 if unaligned else 0)), float("nan"), dtype=torch.bfloat16,
                      device="cuda")
    cache = base[..., 1:] if unaligned else base
    table = torch.randperm(pages, generator=g, device="cuda").view(len(lengths), width).to(torch.int32)
    for b, n in enumerate(lengths):
        used = -(-n // page_size)
        for j in range(used):
            # the last request's length is clamped to the table's capacity: fill its pages whole
            rows = page_size if b == len(lengths) - 1 else min(page_size, n - j * page_size)
            cache[table[b, j], :rows] = torch.randn(rows, dim, generator=g, device="cuda", dtype=torch.bfloat16)
        table[b, used:] = 2 ** 30 if b % 2 else -7  # entries past the length: never read
    table[0, 0] = 10 ** 9  # within the length, outside the cache: an absent key
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    lens[-1] = 2 ** 31 - 1  # past the table's capacity: clamped
    q = torch.randn(len(lengths), heads, dim, generator=g, device="cuda", dtype=torch.bfloat16)
    kv_scale = 0.01 if recipe == "fp8cache" else None
    if kv_scale is not None:  # the E4M3 codes of those values (NaN rows: NaN codes), rows unaligned as before
        base = (base.float() / kv_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        cache = base[..., 1:] if unaligned else base
    k, v, p = {"bf16": (None,) * 3, "fp8cache": (None,) * 3, "fp8": ("fp8",) * 3, "nvfp4": ("nvfp4",) * 3,
               "fp8_p_nvfp4": ("fp8", "fp8", "nvfp4")}[recipe]
    _, call = validate_decode(q, cache, table, lens, softmax_scale=0.04, kv_lora_rank=512, qk_rope_head_dim=64,
                              page_size=None, num_kv_splits=splits, k_qdq=k, k_qdq_amax=None, v_qdq=v,
                              v_qdq_amax=None, p_qdq=p, p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                              kv_scale=kv_scale)
    config = {"wgmma": decode.WGMMA, "keys_m": decode.KEYS_M, "ring4": decode.RING4}.get(shape) or {
        "head_tiles": shape[0], "warps": shape[1]}
    out, lse = decode.run(build.build(), call, config)
    torch.cuda.synchronize()
    ok = not torch.isnan(out).any().item() and not torch.isnan(lse).any().item()
    print(f"heads={heads} page={page_size} lengths={lengths} splits={splits} {recipe} shape={shape} "
          f"unaligned={unaligned}: {'ok' if ok else 'NaN'}", flush=True)
    return ok


def _sparse_case(heads, q_len, lengths, top_k, splits, seed=0, ds_mla=False):
    from mla_core.layouts import pack_fp8_ds_mla
    from mla_core.specs import validate_sparse_decode

    from . import build, sparse
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = 1000
    idx = torch.randint(0, rows - 1, (len(lengths), q_len, top_k), generator=g, device="cuda", dtype=torch.int32)
    idx[torch.rand(idx.shape, generator=g, device="cuda") < 0.1] = -1
    width = 656 if ds_mla else 576
    cache = torch.full((rows, width), 0xFF, dtype=torch.uint8, device="cuda")  # NaN codes (scales, RoPE values)
    for b, n in enumerate(lengths):
        sel = idx[b, :, :n]
        row = (pack_fp8_ds_mla(torch.randn(1, 576, generator=g, device="cuda")) if ds_mla
               else torch.randint(0, 0x7E, (1, 576), generator=g, device="cuda", dtype=torch.uint8))
        cache[sel[sel >= 0].long()] = row
        idx[b, :, n:] = rows + 64 * b       # past the length, past the cache: never read
        idx[b, :, n + 1::2] = rows - 1      # past the length: a NaN row
    idx[0, 0, 0] = 2 ** 31 - 1             # within the length, outside the cache: not a key
    query = torch.randn(len(lengths), q_len, heads, 576, generator=g, device="cuda").to(
        torch.bfloat16 if ds_mla else torch.float8_e4m3fn)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    kv = cache.view(rows, 1, width) if ds_mla else cache.view(torch.float8_e4m3fn).view(rows, 1, 576)
    _, call = validate_sparse_decode(query, kv, 128, 512, 64, idx, lens, top_k, None, 0.05, 1.0, None, True, None)
    out, lse = sparse.run(build.build(), call, {} if splits == "auto" else {"num_splits": splits})
    torch.cuda.synchronize()
    ok = not torch.isnan(out).any().item() and not torch.isnan(lse).any().item()
    print(f"sparse {'fp8_ds_mla' if ds_mla else 'fp8'} heads={heads} q_len={q_len} lengths={lengths} top_k={top_k} "
          f"splits={splits}: "
          f"{'ok' if ok else 'NaN'}", flush=True)
    return ok


def _prefill_case(heads, kv_heads, lens_q, lens_k, causal, recipe, seed=0, config=None):
    from mla_core.specs import validate_prefill

    from . import build, prefill
    g = torch.Generator(device="cuda").manual_seed(seed)
    pad = 5  # rows past the last sequence: NaN, never read
    total_q, total_k = sum(lens_q), sum(lens_k)

    def packed(rows, h, d):
        x = torch.full((rows + pad, h, d), float("nan"), dtype=torch.bfloat16, device="cuda")
        x[:rows] = torch.randn(rows, h, d, generator=g, device="cuda", dtype=torch.bfloat16)
        return x[:rows]

    q, k, v = packed(total_q, heads, 192), packed(total_k, kv_heads, 192), packed(total_k, kv_heads, 128)
    cu_q = torch.tensor([0] + lens_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, device="cuda").cumsum(0).to(torch.int32)
    fmt = {"bf16": None, "fp8": "fp8", "nvfp4": "nvfp4"}[recipe]
    problem, call = validate_prefill(
        q, k, v, cu_q, cu_k, max(lens_q), 192 ** -0.5, causal, True, q_quant=fmt, k_quant=fmt, p_quant=fmt,
        v_quant=fmt, q_amax=4.0, k_amax=4.0, p_amax=1.0, v_amax=4.0, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
        dense_recent_tokens=64, block_m=64, block_n=64)
    out, lse = prefill.run(build.build(), call, prefill.configs(problem)[0] if config is None else config)
    torch.cuda.synchronize()
    ok = not torch.isnan(out).any().item() and not torch.isnan(lse).any().item()
    print(f"prefill heads={heads}/{kv_heads} lens_q={lens_q} lens_k={lens_k} causal={causal} {recipe}: "
          f"{'' if config is None else f'{config} '}{'ok' if ok else 'NaN'}", flush=True)
    return ok


def _prefill_main() -> int:
    from . import prefill
    ok = _prefill_case(128, 128, [0, 1, 70, 129], [0, 1, 70, 129], True, "bf16")
    ok &= _prefill_case(16, 2, [1, 65, 17], [300, 65, 200], True, "bf16")
    ok &= _prefill_case(8, 8, [64, 3, 0], [64, 130, 9], False, "fp8", config={})  # the bf16-product config
    ok &= _prefill_case(128, 128, [200, 1], [331, 1], True, "fp8", config={})
    ok &= _prefill_case(8, 8, [64, 3, 0], [64, 130, 9], False, "fp8", config=prefill.FP8_MMA)
    ok &= _prefill_case(16, 2, [200, 1, 0, 70], [331, 1, 40, 64], True, "fp8", config=prefill.FP8_MMA)
    return _prefill_nvfp4_main() | _prefill_persistent_main() | (0 if ok else 1)


def _prefill_persistent_main() -> int:
    """The persistent bf16 kernel's cases: more items than SMs (128 heads), items without a key, tail tiles, GQA."""
    from . import prefill
    ok = _prefill_case(128, 128, [0, 1, 70, 129, 300], [0, 1, 70, 129, 300], True, "bf16", config=prefill.PERSISTENT)
    ok &= _prefill_case(16, 2, [1, 65, 17, 5], [300, 65, 200, 0], True, "bf16", config=prefill.PERSISTENT)
    ok &= _prefill_case(8, 8, [64, 3, 0], [64, 130, 9], False, "bf16", config=prefill.PERSISTENT)
    return 0 if ok else 1


def _prefill_nvfp4_main() -> int:
    """The nvfp4 recipe's cases (its pre-pass along features and along keys, P's NVFP4 in the kernel)."""
    ok = _prefill_case(8, 8, [64, 3, 0], [64, 130, 9], False, "nvfp4")
    ok &= _prefill_case(16, 2, [200, 1, 0, 70, 17], [331, 1, 40, 64, 33], True, "nvfp4")
    ok &= _prefill_case(128, 128, [129, 1], [129, 1], True, "nvfp4")
    return 0 if ok else 1


def main() -> int:
    os.environ["MLA_CORE_CHECKS"] = "metadata"
    if sys.argv[1:] == ["sparse"]:
        return _sparse_main()
    if sys.argv[1:] == ["prefill"]:
        return _prefill_main()
    if sys.argv[1:] == ["prefill_nvfp4"]:
        return _prefill_nvfp4_main()
    if sys.argv[1:] == ["prefill_persistent"]:
        return _prefill_persistent_main()
    if sys.argv[1:] == ["ring4"]:
        return 0 if _ring4_cases() else 1
    ok = _decode_main()
    if sys.argv[1:] == ["decode"]:
        return 0 if ok else 1
    return _sparse_main() | _prefill_main() | (0 if ok else 1)


def _ring4_cases() -> bool:
    """The four-slot ring's cases (``ring4`` alone: only these)."""
    ok = _case(128, 64, [129, 64, 1, 300, 0], 3, "bf16", "ring4")
    ok &= _case(65, 48, [1, 700, 0, 129], 1, "bf16", "ring4", unaligned=True)  # padded heads, odd steps, 2-byte path
    return ok


def _decode_main() -> bool:
    ok = _ring4_cases()  # the four-slot ring first (the newest)
    ok &= _case(16, 1, [0, 1, 33, 70], 3, "bf16", "keys_m")  # the keys-as-M kernel
    ok &= _case(8, 33, [1, 700, 0, 129], 1, "bf16", "keys_m", unaligned=True)  # padded heads, odd steps, 2-byte path
    ok &= _case(1, 64, [129, 64, 1, 300], 32, "bf16", "keys_m")
    ok &= _case(16, 1, [0, 1, 33, 70], 3, "bf16", (1, 4))
    ok &= _case(128, 16, [31, 32, 100, 5], 32, "nvfp4", (4, 8))
    ok &= _case(20, 64, [65, 200, 0, 130], 1, "fp8", (2, 8))
    ok &= _case(128, 64, [129, 64, 1, 300], 3, "fp8", (2, 4), unaligned=True)
    ok &= _case(1, 16, [17, 48], 32, "nvfp4", (1, 4), unaligned=True)
    ok &= _case(128, 1, [0, 1, 33, 70], 3, "bf16", "wgmma")
    ok &= _case(64, 16, [31, 32, 100, 65], 32, "bf16", "wgmma", unaligned=True)
    ok &= _case(128, 64, [129, 64, 1, 300], 1, "bf16", "wgmma")
    ok &= _case(64, 256, [1000, 3, 0, 301], 3, "bf16", "wgmma")  # the producer's TMA boxes, a page over 4 steps
    ok &= _case(20, 16, [1, 300, 0, 64], 2, "bf16", "wgmma")
    ok &= _case(128, 48, [1, 300, 0, 97], 3, "bf16", "wgmma")
    ok &= _case(1, 1, [70, 33], 5, "bf16", "wgmma", unaligned=True)
    ok &= _case(128, 16, [31, 32, 100, 65], 32, "fp8", "wgmma")
    ok &= _case(20, 1, [0, 1, 33, 70], 3, "fp8", "wgmma", unaligned=True)
    ok &= _case(128, 48, [1, 300, 0, 97], 1, "fp8_p_nvfp4", "wgmma")
    ok &= _case(16, 64, [129, 64, 1, 300], 2, "fp8_p_nvfp4", "wgmma", unaligned=True)
    ok &= _case(64, 256, [1000, 3, 0, 301], 3, "fp8", "wgmma")  # K = V FP8 on the TMA boxes (landed barriers)
    ok &= _case(128, 33, [1, 300, 0, 97], 3, "fp8cache", "wgmma")
    ok &= _case(16, 64, [129, 64, 1, 300], 32, "fp8cache", "wgmma", unaligned=True)
    ok &= _case(20, 1, [0, 1, 33, 70], 1, "fp8cache", "wgmma")
    ok &= _case(8, 33, [1, 700, 0, 129], 1, "fp8cache", "wgmma")  # keys-as-M kernel: padded heads, odd steps
    # 128 splits (numerics.MAX_KV_SPLITS): a tile per split (4096 keys), empty splits, the last request clamped
    ok &= _case(16, 64, [4096, 1, 0, 4100], 128, "bf16", "wgmma")
    ok &= _case(128, 64, [4096, 1, 0, 4100], 128, "fp8", "wgmma")
    ok &= _case(16, 64, [4096, 1, 0, 4100], 128, "bf16", "keys_m")
    ok &= _case(128, 64, [4096, 1, 0, 4100], 128, "nvfp4", (4, 8))
    return ok


def _sparse_main() -> int:
    ok = _sparse_case(64, 2, [0, 1, 65, 128], 128, 1)
    ok &= _sparse_case(128, 1, [192, 63, 0], 192, 4)
    ok &= _sparse_case(192, 3, [256, 100], 256, "auto")
    ok &= _sparse_case(64, 2, [0, 1, 65, 128], 128, 1, ds_mla=True)
    ok &= _sparse_case(128, 1, [192, 63, 0], 192, 4, ds_mla=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
