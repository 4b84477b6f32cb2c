"""CPU emulation of the prefill kernel's Q NVFP4 step (csrc/mla_prefill_wgmma.cu q_nvfp4, q_fmt 3 / 4): a consumer
warpgroup's 64 Q rows as TMA lands them (3 slabs of [64 rows x 128 B], 16-byte chunk c of row r at chunk c ^ (r % 8)
of its 128-byte line: the 128-byte swizzle), every aligned 32-byte unit of the 24 KB replaced by
numerics.nvfp4_unscaled of its 16 bf16 values (the pre-pass's block rule), read back through the swizzle: equal to
numerics.nvfp4_unscaled of the rows along features (the pre-pass's values) bit for bit, i.e. each unit is one
16-feature block. ``unit_pairs(stride)`` takes the unit's second chunk `stride` bytes after its first (16: the
kernel; 2048: mutant 35's chunk 16 rows down), so the emulation also shows that bug changes the values.

    python3 benchmarks/probes/q_nvfp4_swizzle_emulation.py      (exit 0: equal; the mutant's layout differs)
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402

ROWS, FEATURES, SLAB_COLS = 64, 192, 64  # one warpgroup's Q rows; 3 slabs of 64 features (128 B)


def swizzle(q: torch.Tensor) -> torch.Tensor:
    """[64, 192] bf16 rows -> the 24 KB shared-memory image as [1536 chunks, 8] bf16 (slab-major, swizzled)."""
    img = torch.empty(3, ROWS, 8, 8, dtype=q.dtype)
    for s in range(3):
        for r in range(ROWS):
            for c in range(8):
                img[s, r, c ^ (r % 8)] = q[r, SLAB_COLS * s + 8 * c:SLAB_COLS * s + 8 * c + 8]
    return img.reshape(-1, 8)


def unswizzle(img: torch.Tensor) -> torch.Tensor:
    img = img.reshape(3, ROWS, 8, 8)
    q = torch.empty(ROWS, FEATURES, dtype=img.dtype)
    for s in range(3):
        for r in range(ROWS):
            for c in range(8):
                q[r, SLAB_COLS * s + 8 * c:SLAB_COLS * s + 8 * c + 8] = img[s, r, c ^ (r % 8)]
    return q


def in_kernel(q: torch.Tensor, amax: float, stride: int = 16) -> torch.Tensor:
    """q_nvfp4 on the image: unit u = chunks (2u, 2u + stride / 16), quantized as one block, written back."""
    img = swizzle(q).clone()
    out = img.clone()
    step = stride // 16
    for u in range(img.shape[0] // 2):
        a, b = 2 * u, (2 * u + step) % img.shape[0]
        block = torch.cat([img[a], img[b]]).float()
        vals = numerics.nvfp4_unscaled(block, amax, dim=-1).to(torch.bfloat16)
        out[a], out[b] = vals[:8], vals[8:]
    return unswizzle(out)


def main() -> int:
    g = torch.Generator().manual_seed(0)
    amax = 4.5
    q = (torch.randn(ROWS, FEATURES, generator=g) * torch.rand(ROWS, 1, generator=g) * 3).to(torch.bfloat16)
    q[5, 16:32] = 0.0
    q[9, 40] = float("nan")
    want = numerics.nvfp4_unscaled(q.float(), amax, dim=-1).to(torch.bfloat16)
    got = in_kernel(q, amax)
    ok = torch.equal(got.view(torch.int16), want.view(torch.int16))
    bad = in_kernel(q, amax, stride=2048)
    mutant_differs = not torch.equal(bad.view(torch.int16), want.view(torch.int16))
    print(f"in-kernel Q NVFP4 through the swizzle == the pre-pass's values: {ok}; mutant 35's layout differs: "
          f"{mutant_differs}")
    return 0 if ok and mutant_differs else 1


if __name__ == "__main__":
    sys.exit(main())
