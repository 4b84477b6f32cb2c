"""CPU emulation of the WGMMA decode's algorithm (csrc/mla_decode_wgmma.cu) against the reference backend.

Emulated step by step in float32 torch: the split schedule, 64-key steps of two 32-key halves, keys past a
split's end or on pages outside the cache zero-filled and masked, m1 / m2 with the -inf guard, P per half rounded
to the cache dtype against its own maximum, the row sums in the kernel's order (warpgroup 0's half before the
factor 2^(m1 - m2), warpgroup 1's after), O = (O a1 + P0 V0) a2 + P1 V1, the combine. Not the wgmma layouts
(the decode probe verified those on the H200): the numerics argument of docs/cuda.md, checked on the inputs of
the GPU tests (NaN rows past lengths, garbage table entries, pages 1/16/64, splits 1/3/32, bf16 and fp16).

    python3 benchmarks/probes/decode_wgmma_emulation.py     # ~1 min on one CPU core
"""
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
os.environ["MLA_CORE_CHECKS"] = "metadata"
import torch  # noqa: E402
import mla_core  # noqa: E402
from paged_inputs import paged_decode_inputs  # noqa: E402

LOG2E = math.log2(math.e)


def emulate(q, cache, table, lens, scale, splits, dtype):
    B, H, D = q.shape
    ps = cache.shape[1]
    num_pages = cache.shape[0]
    cap = table.shape[1] * ps
    out = torch.zeros(B, H, 512, dtype=torch.float32)
    lse_out = torch.full((B, H), -math.inf)
    scale_log2 = torch.tensor(scale * LOG2E, dtype=torch.float32)
    qf = q.float()
    for b in range(B):
        L = max(0, min(int(lens[b]), cap))
        tiles = (L + 31) // 32
        tps = (tiles + splits - 1) // splits
        parts = []
        for sp in range(splits):
            lo = sp * tps * 32
            hi = min(lo + tps * 32, L)
            steps = (hi - lo + 63) // 64 if hi > lo else 0
            O = torch.zeros(H, 512)
            m = torch.full((H,), -math.inf)
            l0 = torch.zeros(H)
            l1 = torch.zeros(H)
            for it in range(steps):
                pos0 = lo + it * 64
                K = torch.zeros(64, 576, dtype=cache.dtype)
                valid = torch.zeros(64, dtype=torch.bool)
                for r in range(64):
                    tok = pos0 + r
                    if tok < hi:
                        page = int(table[b, tok // ps])
                        if 0 <= page < num_pages:
                            K[r] = cache[page, tok % ps]
                            valid[r] = True
                s = (qf[b] @ K.float().T)  # [H, 64] float32
                x = torch.where(valid[None], s * scale_log2, torch.tensor(-math.inf))
                mx0 = x[:, :32].max(1).values
                mx1 = x[:, 32:].max(1).values
                m1 = torch.maximum(m, mx0)
                m2 = torch.maximum(m1, mx1)
                z1 = torch.where(m1 == -math.inf, 0.0, m1)
                z2 = torch.where(m2 == -math.inf, 0.0, m2)
                a1 = torch.exp2(m - z1)
                a2 = torch.exp2(m1 - z2)
                P0 = torch.exp2(x[:, :32] - z1[:, None])
                P1 = torch.exp2(x[:, 32:] - z2[:, None])
                l0 = (l0 * a1 + P0.sum(1)) * a2  # warpgroup 0: its half before the factor 2^(m1 - m2)
                l1 = (l1 * a1) * a2 + P1.sum(1)
                m = m2
                V = K[:, :512].float()
                O = O * a1[:, None] + P0.to(dtype).float() @ V[:32]
                O = O * a2[:, None] + P1.to(dtype).float() @ V[32:]
            l = l0 + l1
            inv = torch.where(l == 0, 0.0, 1.0 / l)
            o = O * inv[:, None]
            lse = torch.where(l == 0, torch.tensor(-math.inf), (m + torch.log2(l)) / LOG2E)
            parts.append((o, lse))
        if splits == 1:
            out[b], lse_out[b] = parts[0]
        else:
            lses = torch.stack([p[1] for p in parts])  # [S, H]
            mx = lses.max(0).values
            safe = torch.where(mx == -math.inf, 0.0, mx)
            w = torch.exp(lses - safe)
            total = w.sum(0)
            acc = sum(w[i][:, None] * parts[i][0] for i in range(splits))
            out[b] = acc * torch.where(total == 0, 0.0, 1.0 / total)[:, None]
            lse_out[b] = torch.where(total == 0, torch.tensor(-math.inf), safe + torch.log(total))
    return out, lse_out


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main() -> int:
    """Every case against the reference; prints rel L2 / LSE error per case, asserts 1e-2 / 1e-3."""
    worst = 0
    for dtype in (torch.bfloat16, torch.float16):
        for ps in (1, 16, 64):
            for splits in (1, 3, 32):
                lengths = [0, 1, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 2049]
                q, cache, table, lens = paged_decode_inputs(lengths, 8, 576, ps, dtype, seed=ps + splits)
                if ps == 16:  # a page outside the cache within a length (checks off): an absent key
                    table = table.clone()
                    table[10, 1] = 10 ** 9
                    table[11, 0] = -5
                scale = 576 ** -0.5
                o, lse = emulate(q, cache, table, lens, scale, splits, dtype)
                ref, ref_lse = mla_core.mla_attention_decode(q, cache, table, lens, softmax_scale=scale,
                                                             num_kv_splits=splits, backend="reference",
                                                             out_dtype=torch.float32)
                ne = lens > 0
                assert not torch.isnan(o).any() and not torch.isnan(lse).any()
                assert (o[~ne] == 0).all() and (lse[~ne] == -math.inf).all()
                e = rel(o[ne], ref[ne])
                le = (lse[ne] - ref_lse[ne]).abs().max().item()
                worst = max(worst, e)
                print(dtype, ps, splits, f"rel {e:.2e} lse {le:.2e}")
                assert e < 1e-2 and le < 1e-3
    print("worst", worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
