"""CPU check of the WGMMA decode's four-slot ring (round m: csrc/mla_decode_wgmma.cu, decode_wgmma_kernel with kRing;
since round p: csrc/mla_decode_wgmma.cuh, decode_wgmma_ring4_kernel; config {"kernel": "ring4"}) on
decode_wgmma_z_emulation.py's model (imported: the same barrier semantics, buffer hazards and every-interleaving
search, here with four actors).

ring4s (round m's kRing 2, not ported in round p: 1.09-1.34x slower) as well: each slot's two parts (slabs 0-3, slabs
4-8) published on their own full barriers, WG0 waiting part A of both halves before S's first 16 k16 steps and part B
before the rest, WG1 part B before its P·V.

Actors: producer warps 8-9 (keys 0-31 of every step, slots 2s), producer warps 10-11 (keys 32-63, slots 2s + 1), each
waiting its slot's empty (both warpgroups' release of step i - 2's half) and arriving its full; WG0: waits both slots'
full, reads both (S, and the validity words), [step > 0: syncs P0E], writes P and the factors, arrives P0F, P0·V0
reads slot 2s, releases it, P1·V1 reads slot 2s + 1, releases it; WG1: waits slot 2s's full, syncs P0F, reads the
factors and P, P0·V0 reads slot 2s, releases it, waits slot 2s + 1's full, P1·V1 reads it, [not the last step: arrives
P0E], releases it. At the end WG0 writes both row sums, both sync ALL and read them. Every interleaving for 1..T_MAX
steps: no deadlock, no hazard (a slot refilled before both warpgroups released it, a slot read after the reader
released it or holding another step, P or the factors overwritten before read); four broken variants must be caught
(round m's mutants 57 and 58, since round p MUTANT_INDICES 66 and 67 of tests/mutation/mutants_cuda.py, among them;
ring4s: S's part-B steps issued without the part-B wait).

    python3 benchmarks/probes/decode_wgmma_ring4_emulation.py     # 1..6 steps, ~30 s (RING4_T_MAX=4: ~5 s)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import decode_wgmma_z_emulation as z  # noqa: E402


def programs_ring4(T, h1_of=lambda s: 2 * s + 1, early_release=False):
    """h1_of: the slot of keys 32-63 the consumers use (mutant 57: 2 s); early_release: WG0 releases keys 0-31
    before its P0·V0 read them."""
    prods = [[], []]
    for h, prod in enumerate(prods):
        for i in range(T):
            slot = 2 * (i & 1) + h
            if i >= 2:
                prod.append(("mwait", f"empty{slot}", ((i - 2) >> 1) & 1))
            prod += [("slot_fill", slot, i), ("marrive", f"full{slot}")]
    w0, w1 = [("sync", "ALL")], [("sync", "ALL")]
    for i in range(T):
        s, par = i & 1, (i >> 1) & 1
        h0, h1 = 2 * s, h1_of(s)
        w0 += [("mwait", f"full{h0}", par), ("mwait", f"full{h1}", par), ("slot_use", h0, i, 0),
               ("slot_use", h1, i, 0)]
        if i > 0:
            w0.append(("sync", "P0E"))
        w0 += [("write", "P", i), ("write", "fac", i), ("arrive", "P0F")]
        if early_release:
            w0 += [("slot_release", h0, (0, i)), ("marrive", f"empty{h0}"), ("slot_use", h0, i, 0)]
        else:
            w0 += [("slot_use", h0, i, 0), ("slot_release", h0, (0, i)), ("marrive", f"empty{h0}")]
        w0 += [("slot_use", h1, i, 0), ("slot_release", h1, (0, i)), ("marrive", f"empty{h1}")]
        w1 += [("mwait", f"full{h0}", par), ("sync", "P0F"), ("read", "fac", i), ("read_begin", "P", i),
               ("slot_use", h0, i, 1), ("slot_release", h0, (1, i)), ("marrive", f"empty{h0}"),
               ("mwait", f"full{h1}", par), ("slot_use", h1, i, 1), ("read_end", "P", i)]
        if i + 1 < T:
            w1.append(("arrive", "P0E"))
        w1 += [("slot_release", h1, (1, i)), ("marrive", f"empty{h1}")]
    w0 += [("write", "sl0", 0), ("write", "sl1", 0), ("sync", "ALL"), ("read", "sl0", 0), ("read", "sl1", 0)]
    w1 += [("sync", "ALL"), ("read", "sl0", 0), ("read", "sl1", 0)]
    return [prods[0], prods[1], w0, w1]


def programs_ring4s(T, wg1_part="B", no_second_wait=False):
    """ring4s (kRing 2): each slot published in two parts, A (slabs 0-3: S's first 16 k16 steps and V's left half,
    WG0's) and B (slabs 4-8: the rest of S and V's right half, WG1's); a slot still released as a whole. wg1_part:
    the part WG1 waits before its P·V (a broken variant: "A"); no_second_wait: WG0 issues S's part-B steps without
    waiting part B."""
    prods = [[], []]
    for h, prod in enumerate(prods):
        for i in range(T):
            slot = 2 * (i & 1) + h
            if i >= 2:
                prod.append(("mwait", f"empty{slot}", ((i - 2) >> 1) & 1))
            prod += [("slot_fill", f"{slot}A", i), ("marrive", f"full{slot}A"),
                     ("slot_fill", f"{slot}B", i), ("marrive", f"full{slot}B")]
    w0, w1 = [("sync", "ALL")], [("sync", "ALL")]

    def release(w, slot, i):
        return [("slot_release", f"{slot}A", (w, i)), ("slot_release", f"{slot}B", (w, i)),
                ("marrive", f"empty{slot}")]
    for i in range(T):
        s, par = i & 1, (i >> 1) & 1
        h0, h1 = 2 * s, 2 * s + 1
        w0 += [("mwait", f"full{h0}A", par), ("mwait", f"full{h1}A", par), ("slot_use", f"{h0}A", i, 0),
               ("slot_use", f"{h1}A", i, 0)]
        if not no_second_wait:
            w0 += [("mwait", f"full{h0}B", par), ("mwait", f"full{h1}B", par)]
        w0 += [("slot_use", f"{h0}B", i, 0), ("slot_use", f"{h1}B", i, 0)]
        if i > 0:
            w0.append(("sync", "P0E"))
        w0 += [("write", "P", i), ("write", "fac", i), ("arrive", "P0F"), ("slot_use", f"{h0}A", i, 0)]
        w0 += release(0, h0, i) + [("slot_use", f"{h1}A", i, 0)] + release(0, h1, i)
        w1 += [("mwait", f"full{h0}{wg1_part}", par), ("sync", "P0F"), ("read", "fac", i), ("read_begin", "P", i),
               ("slot_use", f"{h0}B", i, 1)] + release(1, h0, i)
        w1 += [("mwait", f"full{h1}{wg1_part}", par), ("slot_use", f"{h1}B", i, 1), ("read_end", "P", i)]
        if i + 1 < T:
            w1.append(("arrive", "P0E"))
        w1 += release(1, h1, i)
    w0 += [("write", "sl0", 0), ("write", "sl1", 0), ("sync", "ALL"), ("read", "sl0", 0), ("read", "sl1", 0)]
    w1 += [("sync", "ALL"), ("read", "sl0", 0), ("read", "sl1", 0)]
    return [prods[0], prods[1], w0, w1]


def run_checker(fn, tiles, full_count=1):
    counts = dict(z.MB_COUNT)
    z.MB_COUNT.update({f"empty{k}": 2 for k in range(4)})
    z.MB_COUNT.update({f"full{k}{p}": full_count for k in range(4) for p in ("", "A", "B")})
    orig = z.programs
    z.programs = fn
    try:
        return [z.check_protocol(T) for T in tiles]
    finally:
        z.programs = orig
        z.MB_COUNT.clear()
        z.MB_COUNT.update(counts)


def main() -> int:
    t_max = int(os.environ.get("RING4_T_MAX", "6"))
    bad = 0
    print(f"1. protocol (every interleaving, 1..{t_max} steps):")
    for name, fn in (("ring4", programs_ring4), ("ring4s", programs_ring4s)):
        for T, (states, finals, dl) in zip(range(1, t_max + 1), run_checker(fn, range(1, t_max + 1))):
            print(f"  {name} T={T}: {states} states, {finals} ends, {len(dl)} deadlocks")
            bad += bool(dl) or finals == 0

    def no_wg1_second_wait(T):  # WG1 reads keys 32-63 relying on WG0's wait (caught only as a hazard if unordered)
        p = programs_ring4(T)
        p[3][:] = [op for op in p[3] if not (op[0] == "mwait" and op[1] in ("full1", "full3"))]
        return p

    def no_producer_empty_wait(T):  # the keys 32-63 pair refills without waiting its slot's release
        p = programs_ring4(T)
        p[1][:] = [op for op in p[1] if op[0] != "mwait"]
        return p

    variants = [("57: keys 32-63 on keys 0-31's slot", lambda T: programs_ring4(T, h1_of=lambda s: 2 * s), 1),
                ("58: a slot's full counts both producer pairs", programs_ring4, 2),
                ("WG0 releases keys 0-31 before its P0·V0", lambda T: programs_ring4(T, early_release=True), 1),
                ("second pair refills without its empty wait", no_producer_empty_wait, 1),
                ("ring4s: WG0's S steps 16-35 without the part-B wait", lambda T: programs_ring4s(T, no_second_wait=True),
                 1)]
    caught = 0
    for name, fn, full_count in variants:
        found = None
        for T in range(1, t_max + 1):
            try:
                (_, finals, dl), = run_checker(fn, [T], full_count)
                if dl or finals == 0:
                    found = f"deadlock at T={T}"
            except (z.Hazard, AssertionError, KeyError) as e:
                found = f"{type(e).__name__}: {str(e)[:90]}"
            if found:
                break
        print(f"  broken '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    # not a protocol error in this model (WG0's wait orders it; the kernel keeps WG1's own acquire for the async proxy)
    (_, finals, dl), = run_checker(no_wg1_second_wait, [min(3, t_max)])
    print(f"  (WG1 without its keys 32-63 wait: {'deadlock' if dl else 'no hazard in the model'}, as expected)")
    ok = bad == 0 and caught == len(variants)
    print(f"broken variants caught: {caught} of {len(variants)}\n{'ALL PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
