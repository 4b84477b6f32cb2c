"""CPU checks of the WGMMA decode's schedule Q1 (csrc/mla_decode_wgmma.cu, q1_step; branch
wip/decode-128-heads-w), on decode_wgmma_z_emulation.py's model (imported: the same barrier semantics, buffer
hazards and every-interleaving search).

1. Protocol: Z's producer and ring unchanged; WG0 waits full, computes S of the whole step and the softmax,
   [step > 0: syncs P0E], writes P (both halves) and the factors (smx0 / smx1 hold a1 / a2), arrives P0F, does its
   P·V, releases the stage; WG1 waits full (its own acquire of the stage's V), syncs P0F, reads the factors and P,
   [not the last step: arrives P0E], releases the stage. At the end WG0 writes both row sums, both sync ALL and
   read them. Every interleaving of producer / WG0 / WG1 for 1..6 steps: no deadlock, no hazard, no generation
   completed by arrivals alone; the same for q1p (WG0 waits step i + 1's stage and issues its S inside step i);
   six broken variants must be caught.
2. Layout: the m64n64k16 accumulator's (row, key) of register j (the PTX ISA's wgmma D fragment: row 16 (t / 32) +
   (t % 32) / 4 + 8 ((j / 2) % 2), column 8 (j / 4) + 2 (t % 4) + j % 2) is, for j < 16, the m64n32k16 fragment's
   and, for j >= 16, the m64n32k16 fragment's of register j - 16 with the key + 32: q1_step's s0 / s1 are Z's two
   warpgroups' S halves, element for element, so the masking, maxima, P and row sums see the same values in the
   same per-thread order.
3. Numerics: Q1's program (WG0 computes m1, m2, a1, a2, P0, P1, l_0 and l_1; WG1 gets a1, a2 through shared
   memory; per-warp rescale skips) against Z's per-warpgroup program on random tiles (masked tails, rising and
   settled maxima): float32 m, l and O bit for bit equal. (What the CPU cannot check: that m64n64k16 sums an
   element's 36 k-steps as m64n32k16 does; the device A/B's bit-equality answers that.)

    python3 benchmarks/probes/decode_wgmma_q1_emulation.py     # a few seconds
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import decode_wgmma_z_emulation as z  # noqa: E402


def programs_q1(T, pipe=False):
    """pipe (q1p): WG0 waits step i + 1's stage and issues its S in the middle of step i (before P0E / P0F)."""
    prod, w0, w1 = [], [], []
    for i in range(T):
        s = i & 1
        if i >= 2:
            prod.append(("mwait", f"empty{s}", ((i - 2) >> 1) & 1))
        prod += [("fill", i), ("marrive", f"full{s}_0")]
    for w in (w0, w1):
        w.append(("sync", "ALL"))  # Q loaded
    for i in range(T):
        s = i & 1
        full = ("mwait", f"full{s}_0", (i >> 1) & 1)
        if not pipe or i == 0:
            w0 += [full, ("stage_use", i)]
        if pipe and i + 1 < T:
            w0 += [("mwait", f"full{s ^ 1}_0", ((i + 1) >> 1) & 1), ("stage_use", i + 1)]
        if i > 0:
            w0.append(("sync", "P0E"))
        w0 += [("write", "P", i), ("write", "fac", i), ("arrive", "P0F"), ("release", (0, i)),
               ("marrive", f"empty{s}")]
        w1 += [full, ("stage_use", i), ("sync", "P0F"), ("read", "fac", i), ("read_begin", "P", i),
               ("read_end", "P", i)]
        if i + 1 < T:
            w1.append(("arrive", "P0E"))
        w1 += [("release", (1, i)), ("marrive", f"empty{s}")]
    w0 += [("write", "sl0", 0), ("write", "sl1", 0), ("sync", "ALL"), ("read", "sl0", 0), ("read", "sl1", 0)]
    w1 += [("sync", "ALL"), ("read", "sl0", 0), ("read", "sl1", 0)]
    return [prod, w0, w1]


def run_checker(fn, tiles):
    z.GROUPS[0] = 1
    orig = z.programs
    z.programs = fn
    try:
        return [z.check_protocol(T) for T in tiles]
    finally:
        z.programs = orig


def check_protocol():
    bad = 0
    for pipe in (False, True):
        for T, (states, finals, dl) in zip(range(1, 7), run_checker(lambda T: programs_q1(T, pipe), range(1, 7))):
            print(f"  {'q1p' if pipe else 'q1 '} T={T}: {states} states, {finals} ends, {len(dl)} deadlocks")
            bad += bool(dl) or finals == 0
    return bad


def check_mutants():
    def p0e_on_first(p, T):  # WG0 waits P0E on step 0 too
        k = p[1].index(("write", "P", 0))
        p[1].insert(k, ("sync", "P0E"))
        return p

    def no_p0e(p, T):  # P rewritten without WG1's go-ahead
        p[1][:] = [op for op in p[1] if op != ("sync", "P0E")]
        p[2][:] = [op for op in p[2] if op != ("arrive", "P0E")]
        return p

    def p0e_before_read(p, T):  # WG1 arrives P0E before its P·V read the slab
        w1 = p[2]
        for i in range(T - 1):
            w1.remove(("arrive", "P0E"))
            w1.insert(w1.index(("read_begin", "P", i)), ("arrive", "P0E"))
        return p

    def wg1_no_full_wait(p, T):  # WG1 relies on WG0's full wait (no acquire of its own)
        p[2][:] = [op for op in p[2] if op[0] != "mwait"]
        return p

    def fac_after_arrive(p, T):  # the factors written after P0F
        w0 = p[1]
        for i in range(T):
            w0.remove(("write", "fac", i))
            w0.insert(w0.index(("arrive", "P0F")) + 1 if i == 0 else
                      [j for j, op in enumerate(w0) if op == ("arrive", "P0F")][i] + 1, ("write", "fac", i))
        return p

    def pipe_no_next_wait(p, T):  # q1p issues S(i + 1) without waiting its stage
        p = programs_q1(T, True)
        p[1][:] = [op for k, op in enumerate(p[1]) if not (op[0] == "mwait" and k > 2)]
        return p

    caught = 0
    for name, mut in [("q1p: S(i + 1) without its full wait", pipe_no_next_wait), ("P0E waited on step 0", p0e_on_first), ("no P-empty barrier", no_p0e),
                      ("P0E arrived before the slab read", p0e_before_read),
                      ("WG1 without its full wait", wg1_no_full_wait), ("factors written after P0F", fac_after_arrive)]:
        found = None
        for T in range(1, 6):
            try:
                (_, _, dl), = run_checker(lambda T, mut=mut: mut(programs_q1(T), T), [T])
                if dl:
                    found = f"deadlock at T={T}"
            except (z.Hazard, AssertionError, KeyError) as e:
                found = f"{type(e).__name__}: {e}"
            if found:
                break
        print(f"  mutant '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    return caught, 6


def check_layout():
    """(row, key) of each accumulator register, n64 vs the two n32 halves, for all 128 threads."""
    def frag(t, j):
        return 16 * (t // 32) + (t % 32) // 4 + 8 * ((j // 2) % 2), 8 * (j // 4) + 2 * (t % 4) + j % 2
    bad = 0
    for t in range(128):
        for j in range(32):
            row, key = frag(t, j)
            row32, key32 = frag(t, j % 16)
            bad += (row, key) != (row32, key32 + 32 * (j // 16))
            # q1_step's masking and max split: key from j % 16 as Z computes it, rows lo / hi by j & 2
            zk = 8 * ((j % 16) >> 2) + 2 * (t & 3) + (j & 1)
            bad += key != zk + 32 * (j // 16) or (row == 16 * (t // 32) + (t % 32) // 4 + 8) != bool(j & 2)
    return bad


def run_q1(S, V, m, l0, l1, O, nvalid, scale_log2):
    """Q1: WG0's program for the whole step; WG1 only applies a1, a2 read from shared memory."""
    cols = torch.arange(32)
    x0 = torch.where(cols[None] < nvalid, S[:, :32] * scale_log2, torch.tensor(-torch.inf))
    x1 = torch.where(cols[None] < nvalid - 32, S[:, 32:] * scale_log2, torch.tensor(-torch.inf))
    mx0, mx1 = x0.max(1).values, x1.max(1).values
    m1 = torch.maximum(m, mx0)
    m2 = torch.maximum(m1, mx1)
    a1, a2 = z.ex2(m - m1), z.ex2(m1 - m2)
    P0, P1 = z.ex2(x0 - m1[:, None]), z.ex2(x1 - m2[:, None])
    l0 = (l0 * a1 + P0.sum(1)) * a2
    l1 = (l1 * a1) * a2 + P1.sum(1)
    sa1, sa2 = a1.clone(), a2.clone()  # smx0, smx1 -> WG1
    OL = z.scale_warps(z.scale_warps(O[:, :256], a1) + P0.bfloat16().float() @ V[:32, :256], a2) + \
        P1.bfloat16().float() @ V[32:, :256]
    OR = z.scale_warps(z.scale_warps(O[:, 256:], sa1) + P0.bfloat16().float() @ V[:32, 256:], sa2) + \
        P1.bfloat16().float() @ V[32:, 256:]
    return m2, l0, l1, torch.cat([OL, OR], 1)


def check_numerics():
    g = torch.Generator().manual_seed(11)
    bad = 0
    for trial in range(40):
        L = int(torch.randint(1, 640, (1,), generator=g))
        m_z = m_q = torch.full((64,), -torch.inf)
        l0z = l1z = l0q = l1q = torch.zeros(64)
        Oz = Oq = torch.zeros(64, 512)
        spread = float(torch.rand(1, generator=g)) * 40
        for it in range((L + 63) // 64):
            drift = 3 * it if trial % 2 else 0
            S = torch.randn(64, 64, generator=g) * spread + torch.randn(64, 1, generator=g) * drift
            V = torch.randn(64, 512, generator=g).bfloat16().float()
            nvalid = L - 64 * it
            V[max(0, nvalid):] = 0
            m_z, l0z, l1z, Oz = z.run_z(S, V, m_z, l0z, l1z, Oz, nvalid, 1.4426950408889634 * 0.1)
            m_q, l0q, l1q, Oq = run_q1(S, V, m_q, l0q, l1q, Oq, nvalid, 1.4426950408889634 * 0.1)
        same = torch.equal(m_z, m_q) and torch.equal(l0z, l0q) and torch.equal(l1z, l1q) and torch.equal(Oz, Oq)
        bad += not same
        if not same:
            print(f"  trial {trial} L={L}: Q1 differs from Z")
    return bad


def main() -> int:
    print("1. protocol (every interleaving, 1..6 steps):")
    bad = check_protocol()
    caught, n = check_mutants()
    lay = check_layout()
    print(f"2. layout: {lay} mismatches (128 threads x 32 registers)")
    num = check_numerics()
    print(f"3. numerics: {40 - num} of 40 random requests bit-equal to Z")
    ok = bad == 0 and caught == n and lay == 0 and num == 0
    print(f"mutants caught: {caught} of {n}\n{'ALL PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
