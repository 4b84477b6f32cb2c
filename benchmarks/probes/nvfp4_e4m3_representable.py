"""Whether NVFP4 values (E2M1 code x E4M3 block scale, the per-tensor scale g outside) are FP8 E4M3 values, exhaustively
(CPU, ~2 s): the question of round (m) (benchmarks/NOTES.md, "Prefill nvfp4 recipe on cuda (round m)"), whether the
FP8-wgmma prefill could take the nvfp4 recipe's operands as E4M3 codes with only the per-tensor scales outside the dots.

Checks, over every E2M1 magnitude v and every finite non-negative E4M3 block code c (numerics' formats):
  1. v * c (exact in float64) is an E4M3 value, split by whether it lies within E4M3's range (<= 448);
  2. v * c is a bf16 value and an f16 value (the bf16 / f16 operand designs);
  3. numerics' dequantized value RN32(v * RN32(c * g)) divided back by g (RN32) equals v * c, for sampled float32 g
     (whether "the dequantized value / g" is the same number as the code product);
  4. the same for P's operand: P rounded to bf16, then NVFP4 with g = p_amax / 2688.
Prints counts and the first counterexamples; exits 1 if any assertion about the designs fails.
"""
from __future__ import annotations

import itertools
import sys

import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402


def e4m3_values() -> torch.Tensor:
    """Every finite non-negative E4M3 (fn) value, float64, ascending (127 of them, 0 included)."""
    codes = torch.arange(0, 128, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return codes[torch.isfinite(codes)].unique()


def main() -> int:
    e4m3 = e4m3_values()
    e4m3_set = set(e4m3.tolist())
    e2m1 = [v for v in numerics.E2M1_VALUES]
    rows, fails = [], 0
    total = in_range = in_range_exact = out_range = 0
    examples = []
    for v, c in itertools.product(e2m1, e4m3.tolist()):
        p = v * c  # exact in float64 (<= 2 + 4 significant bits)
        total += 1
        if p <= numerics.E4M3_MAX:
            in_range += 1
            if p in e4m3_set:
                in_range_exact += 1
            elif len(examples) < 6:
                examples.append((v, c, p))
        else:
            out_range += 1
    print(f"products v*c: {total} (8 E2M1 magnitudes x {len(e4m3)} E4M3 block codes)")
    print(f"  within E4M3's range (<= 448): {in_range}, of which exactly E4M3: {in_range_exact}, "
          f"not: {in_range - in_range_exact}")
    print(f"  above 448 (up to 6 * 448 = 2688): {out_range}")
    print("  first counterexamples (v, c, v*c):", examples)
    # per E2M1 magnitude: how many block codes keep v*c an in-range E4M3 value
    for v in e2m1:
        ok = sum(1 for c in e4m3.tolist() if v * c <= 448 and v * c in e4m3_set)
        print(f"  v = {v}: {ok} of {len(e4m3)} block codes give an E4M3 product")
    # bf16 / f16: every product exactly representable?
    prods = torch.tensor([v * c for v, c in itertools.product(e2m1, e4m3.tolist())], dtype=torch.float64)
    bf16_ok = bool((prods.to(torch.bfloat16).double() == prods).all())
    f16_ok = bool((prods.to(torch.float16).double() == prods).all())
    print(f"  every v*c exact in bf16: {bf16_ok}; in f16: {f16_ok} (max {prods.max().item()}, "
          f"min nonzero {prods[prods > 0].min().item()})")
    fails += (not bf16_ok) + (not f16_ok)
    # 3. the reference's dequantized value over g, against v*c, for sampled g (float32)
    gen = torch.Generator().manual_seed(0)
    gs = torch.cat([torch.tensor([1.0, 1 / 2688, 0.37 / 2688, 3.0 / 2688, 2.0 ** -20, 1e-30]),
                    torch.exp(torch.empty(2000).uniform_(-30, 10, generator=gen))]).float()
    vv = torch.tensor([v for v, c in itertools.product(e2m1, e4m3.tolist())], dtype=torch.float32)
    cc = torch.tensor([c for v, c in itertools.product(e2m1, e4m3.tolist())], dtype=torch.float32)
    same = differ = 0
    rel = 0.0
    for g in gs:
        s = cc * g                        # numerics: round_e4m3(...) * g, float32
        deq = vv * s                      # numerics: round_e2m1(x / s) * s, float32
        back = deq / g
        exact = vv.double() * cc.double()
        ok = (back.double() == exact) & (deq != 0)
        same += int(ok.sum())
        nz = (deq != 0) & (exact != 0)
        differ += int((~ok & nz).sum())
        r = ((deq.double() - exact * g.double()).abs() / (exact * g.double()).where(nz, 1.0)).where(nz, 0.0)
        rel = max(rel, float(r.max()))
    print(f"RN32(deq / g) == v*c: {same} cases, differs in {differ} (over {len(gs)} g values); "
          f"max |deq - v*c*g| / (v*c*g) = {rel:.3g} (float32 ulp 2^-23 = {2 ** -23:.3g})")
    # 4. P: values in (0, 1] rounded to bf16, then NVFP4 with p_amax = 1 (g = 1/2688): the block code is
    # e4m3(bmax * 448) and v*c as above; report the in-range share for the codes P's blocks can take
    g = numerics.nvfp4_global_scale(1.0)
    pc = numerics.round_e4m3(torch.tensor([b / 6 / g for b in torch.linspace(2 ** -20, 1, 4001).tolist()])).unique()
    p_bad = sum(1 for v, c in itertools.product(e2m1, pc.tolist()) if not (v * c <= 448 and v * c in e4m3_set))
    print(f"P (p_amax 1): {len(pc)} block codes reachable, {p_bad} of {8 * len(pc)} (v, c) pairs not an in-range E4M3")
    verdict = in_range_exact == in_range and out_range == 0
    print("VERDICT: NVFP4 values / g", "ARE" if verdict else "are NOT", "E4M3 values in general;",
          "bf16 holds all of them exactly" if bf16_ok else "bf16 does not hold them")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
