"""CPU checks of the decode probe's variant W (decode_wgmma_probe_w.cu) that need no GPU.

1. Protocol: the producer and the two consumer warpgroups as three programs of barrier operations (mbarrier
   arrive / parity wait, named-barrier bar.arrive / bar.sync counted per warpgroup as the hardware counts threads,
   so a generation completes when two warpgroups' worth arrived, whoever they are), every interleaving explored
   (depth-first, states memoized) for 1..4 rounds. Buffers: each of the two K buffers in two parts (part 0 = the
   owner's V slabs, read by the owner's S and P·V; part 1 = the other V slabs and slab 8, read by the owner's S and
   the other warpgroup's P·V), slab 8 reused for the owner's P, the maxima arrays smxa / smxb. Checked: no deadlock,
   no part refilled before every reader of its previous round finished, no read of a part or P holding another
   round, no P or maxima overwritten before read, no generation completed by arrivals alone or left open at exit.
   Broken variants of the protocol must be caught. The producer's cp.async.mbarrier.arrive.noinc fires after its
   copies land; modelled as an arrival right after the fill (it depends on nothing, so delaying it only delays).
2. Numerics: W's two per-warpgroup programs (each with only what it reads from shared memory: WG1 gets block A's
   maxima, WG0 block B's) in float32 torch against a plain loop over 32-key tiles (running max per tile, P rounded
   to bf16 against it, O and l rescaled per tile): m and O bit for bit, l to float32 rounding (its order differs),
   on random requests with masked tails and missing last blocks, rising and settled maxima.

    python3 benchmarks/probes/decode_wgmma_w_emulation.py     # a few seconds
"""
import sys

import torch

from decode_wgmma_z_emulation import Hazard, scale_warps

# ------------------------------------------------------------------------------------------------------------
# 1. Protocol model. Ops: ("mwait", bar, parity), ("marrive", bar), ("arrive", id), ("sync", id);
# ("fill", X, p, r) producer; ("use", X, p, r) a reader starts on part (X, p) of round r; ("done", X, p, r) it
# finished; ("pwrite", X, r) / ("pread", X, r) P of block X in slab 8 of buffer X; ("write", name, r) /
# ("read", name, r) the maxima and final row sums. Actors: 0 producer, 1 = WG0 (owner of A = buffer 0),
# 2 = WG1 (owner of B = buffer 1).

READERS = {0: lambda x: {1 + x}, 1: lambda x: {1, 2}}  # part -> readers (actors) of buffer x's part


def programs(R):
    """The producer's, WG0's and WG1's operations for a split of R rounds, in k_decode_w's program order."""
    prod, w0, w1 = [], [], []
    for r in range(R):
        for x in (0, 1):
            for p in ((0, 1) if x == 0 else (1, 0)):
                if r > 0:
                    prod.append(("mwait", f"empty{x}{p}", (r - 1) & 1))
                prod += [("fill", x, p, r), ("marrive", f"full{x}{p}")]
    for w in (w0, w1):
        w.append(("sync", "ALL"))  # Q loaded
    for r in range(R):
        par = r & 1
        # WG0: S_A over part 0, then slab 8 and slabs 4-7 (part 1; waited twice: f2, f3)
        w0 += [("mwait", "full00", par), ("use", 0, 0, r), ("mwait", "full01", par), ("use", 0, 1, r),
               ("mwait", "full01", par), ("done", 0, 1, r, "S"),
               ("write", "smxa", r), ("arrive", "MXA"), ("pwrite", 0, r), ("arrive", "PAF"), ("use", 0, 0, r),
               ("sync", "BF"), ("read", "smxb", r), ("done", 0, 0, r), ("marrive", "empty00"),
               ("mwait", "full11", par), ("use", 1, 1, r), ("pread", 1, r), ("done", 1, 1, r), ("marrive", "empty11")]
        # WG1: S_B over part 1 (slabs 0-3, then slab 8), then part 0
        w1 += [("mwait", "full11", par), ("use", 1, 1, r), ("mwait", "full11", par), ("mwait", "full10", par),
               ("use", 1, 0, r), ("done", 1, 1, r, "S"),
               ("sync", "MXA"), ("read", "smxa", r), ("pwrite", 1, r), ("write", "smxb", r), ("arrive", "BF"),
               ("sync", "PAF"), ("mwait", "full01", par), ("use", 0, 1, r), ("pread", 0, r), ("done", 0, 1, r),
               ("marrive", "empty01"), ("use", 1, 0, r), ("done", 1, 0, r), ("marrive", "empty10")]
    w0 += [("write", "sl0", 0), ("sync", "ALL"), ("read", "sl1", 0)]
    w1 += [("write", "sl1", 0), ("sync", "ALL"), ("read", "sl0", 0)]
    return [prod, w0, w1]


PROGRAMS = [programs]


def check_protocol(R):
    """Every interleaving for R rounds: (states, finished interleavings, deadlocked states); raises Hazard."""
    progs = PROGRAMS[0](R)
    init = ((0, 0, 0), frozenset(), frozenset(), frozenset(), frozenset())
    seen, deadlocks, finals = set(), [], 0
    stack = [init]

    def unpack(st):
        return list(st[0]), dict(st[1]), dict(st[2]), dict(st[3]), dict(st[4])

    def pack(pcs, waiting, named, mbar, bufs):
        return (tuple(pcs), frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                frozenset(bufs.items()))

    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        pcs, waiting, named, mbar, bufs = unpack(st)
        if all(pcs[a] == len(progs[a]) for a in range(3)) and not waiting:
            finals += 1
            if any(c != 0 for c, _ in named.values()):
                raise Hazard(f"R={R}: named barrier generation left open at exit: {named}")
            continue
        moved = False
        for a in range(3):
            if pcs[a] == len(progs[a]):
                continue
            pcs2, waiting2, named2, mbar2, bufs2 = unpack(st)
            if a in waiting2:  # blocked in bar.sync until its generation completes
                bid, gen = waiting2[a]
                if named2.get(bid, (0, 0))[1] == gen:
                    continue
                del waiting2[a]
                pcs2[a] += 1
                stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2))
                moved = True
                continue
            op = progs[a][pcs[a]]
            kind = op[0]
            if kind == "mwait":  # try_wait.parity passes once the phase of this parity has completed
                if (mbar2.get(op[1], (0, 0))[1] & 1) == op[2]:
                    continue
            elif kind == "marrive":  # every barrier: one actor's arrivals complete a phase (128 producer
                pending, phase = mbar2.get(op[1], (0, 0))  # threads, or lane 0 of the reader's 4 warps)
                mbar2[op[1]] = (0, phase + 1)
            elif kind in ("arrive", "sync"):
                count, gen = named2.get(op[1], (0, 0))
                if count + 1 == 2:
                    if kind == "arrive" and not any(w[0] == op[1] for w in waiting2.values()):
                        raise Hazard(f"R={R}: barrier {op[1]} completed by arrivals alone (actor {a})")
                    named2[op[1]] = (0, gen + 1)
                else:
                    named2[op[1]] = (count + 1, gen)
                    if kind == "sync":
                        waiting2[a] = (op[1], gen)
                        stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2))
                        moved = True
                        continue
            elif kind == "fill":
                _, x, p, r = op
                rnd, pending = bufs2.get(("part", x, p), (None, frozenset()))
                if pending:
                    raise Hazard(f"R={R}: part {p} of buffer {x} refilled with round {r} while round {rnd} is still "
                                 f"read by actors {sorted(pending)}")
                bufs2[("part", x, p)] = (r, frozenset(READERS[p](x)))
            elif kind == "use":
                _, x, p, r = op
                rnd, pending = bufs2.get(("part", x, p), (None, frozenset()))
                if rnd != r or a not in pending:
                    raise Hazard(f"R={R}: actor {a} reads part {p} of buffer {x} for round {r}; it holds {rnd}")
            elif kind == "done":
                x, p, r = op[1], op[2], op[3]
                rnd, pending = bufs2[("part", x, p)]
                assert rnd == r and a in pending, (op, rnd, pending)
                bufs2[("part", x, p)] = (rnd, pending - {a})
            elif kind == "pwrite":  # the owner's P into slab 8: its S on slab 8 done, the slab still round r's
                _, x, r = op
                rnd, pending = bufs2.get(("part", x, 1), (None, frozenset()))
                if rnd != r or a in pending:
                    raise Hazard(f"R={R}: P of block {x} round {r} written into slab 8 holding round {rnd}, "
                                 f"S done: {a not in pending}")
                val, consumed = bufs2.get(("P", x), (None, True))
                if not consumed:
                    raise Hazard(f"R={R}: P of block {x} round {r} overwrites round {val} before it was read")
                bufs2[("P", x)] = (r, False)
            elif kind == "pread":
                _, x, r = op
                val, _ = bufs2.get(("P", x), (None, True))
                if val != r:
                    raise Hazard(f"R={R}: actor {a} reads P of block {x} for round {r}; the slab holds {val}")
                bufs2[("P", x)] = (val, True)
            elif kind == "write":
                val, consumed = bufs2.get(op[1], (None, True))
                if not consumed:
                    raise Hazard(f"R={R}: {op[1]} overwritten with round {op[2]} before round {val} was read")
                bufs2[op[1]] = (op[2], False)
            elif kind == "read":
                val, _ = bufs2.get(op[1], (None, True))
                if val != op[2]:
                    raise Hazard(f"R={R}: {op[1]} read for round {op[2]} holds {val}")
                bufs2[op[1]] = (val, True)
            pcs2[a] += 1
            stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2))
            moved = True
        if not moved:
            deadlocks.append((pcs, {a: progs[a][pcs[a]] for a in range(3) if pcs[a] < len(progs[a])}))
    return len(seen), finals, deadlocks


def _move(prog, op, after):
    """prog with `op` moved to right after the first occurrence of `after` (None: removed)."""
    prog.remove(op)
    if after is not None:
        prog.insert(prog.index(after) + 1, op)


def mutants():
    """Broken variants the checker must catch."""
    def moved(prog, pick, anchor):
        """prog with every op `pick` accepts moved to right after the preceding op `anchor` accepts."""
        out, held = [], []
        for op in prog:
            if pick(op):
                held.append(op)
                continue
            out.append(op)
        res = []
        for op in out:
            res.append(op)
            if anchor(op):
                res.append(held.pop(0))
        assert not held
        return res

    def rel_early(p, R):  # WG1 releases A's part 1 right after the PAF sync, before its P_A·V_A_R
        p[2][:] = moved(p[2], lambda op: op == ("marrive", "empty01"), lambda op: op == ("sync", "PAF"))
        return p

    def own_rel_early(p, R):  # WG0 releases A's part 0 right after its S (before its own P·V)
        p[1][:] = [op for op in p[1] if not (op[0] == "done" and op[1:3] == (0, 0))]
        p[1][:] = moved(p[1], lambda op: op == ("marrive", "empty00"), lambda op: op[:3] == ("done", 0, 1) and len(op) == 5)
        for r in range(R):
            p[1].insert(p[1].index(("marrive", "empty00"), p[1].index(("done", 0, 1, r, "S"))), ("done", 0, 0, r))
        return p

    def no_bf(p, R):  # WG0 never waits for WG1's P_B (and WG1 never arrives)
        p[1][:] = [op for op in p[1] if op != ("sync", "BF")]
        p[2][:] = [op for op in p[2] if op != ("arrive", "BF")]
        return p

    def no_paf(p, R):  # WG1 reads P_A without waiting for PAF
        p[1][:] = [op for op in p[1] if op != ("arrive", "PAF")]
        p[2][:] = [op for op in p[2] if op != ("sync", "PAF")]
        return p

    def parity(p, R):  # the producer waits for the release with parity r & 1
        p[0][:] = [("mwait", op[1], 1 - op[2]) if op[0] == "mwait" else op for op in p[0]]
        return p

    def no_empty_wait(p, R):  # the producer refills part 1 of buffer A without waiting for its release
        p[0][:] = [op for op in p[0] if op[:2] != ("mwait", "empty01")]
        return p

    def bf_before_mxa(p, R):  # WG0 waits for block B's maxima before publishing block A's (a cycle)
        p[1][:] = [op for op in p[1] if op != ("sync", "BF")]
        for r in range(R):
            k = [i for i, op in enumerate(p[1]) if op == ("arrive", "MXA")][r]
            p[1].insert(k, ("sync", "BF"))
        return p

    def extra_mxa(p, R):  # WG0 arrives at MXA twice in the last round
        k = len(p[1]) - 1 - p[1][::-1].index(("arrive", "MXA"))
        p[1].insert(k, ("arrive", "MXA"))
        return p

    def pwrite_before_s(p, R):  # WG0 writes P_A before its S completed (slab 8 still read)
        for r in range(R):
            p[1].remove(("pwrite", 0, r))
            p[1].insert(p[1].index(("done", 0, 1, r, "S")), ("pwrite", 0, r))
        return p

    caught = 0
    for name, fn in [("A part 1 released before P_A·V_A_R", rel_early),
                     ("A part 0 released before the owner's P·V", own_rel_early),
                     ("no BF barrier", no_bf), ("no PAF barrier", no_paf), ("empty waited with parity r & 1", parity),
                     ("no empty wait for A part 1", no_empty_wait), ("BF waited before the MXA arrival", bf_before_mxa),
                     ("an extra MXA arrival", extra_mxa), ("P_A written before S_A completed", pwrite_before_s)]:
        PROGRAMS[0] = lambda R, fn=fn: fn(programs(R), R)
        found = None
        for R in range(1, 4):
            try:
                _, _, dl = check_protocol(R)
                if dl:
                    found = f"deadlock at R={R}"
            except (Hazard, AssertionError, ValueError) as e:
                found = str(e) or type(e).__name__
            if found:
                break
        PROGRAMS[0] = programs
        print(f"  mutant '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    return caught, 9


# ------------------------------------------------------------------------------------------------------------
# 2. Numerics: W's per-warpgroup programs vs a plain per-32-key-tile loop, float32.


def ex2(x):
    return torch.exp2(x)


def run_tiles(x, V, m, l, O):
    """The contract's order on one round: x [64, 128] scaled scores (masked -inf), V [128, 512]; per 32-key tile:
    m' = max(m, rowmax), O = O·2^(m - m') + bf16(2^(x - m'))·V, l = l·2^(m - m') + sum(2^(x - m'))."""
    for k in range(4):
        xt = x[:, 32 * k:32 * k + 32]
        m2 = torch.maximum(m, xt.max(1).values)
        a = ex2(m - m2)
        P = ex2(xt - m2[:, None])
        l = l * a + P.sum(1)
        O = O * a[:, None] + P.bfloat16().float() @ V[32 * k:32 * k + 32]
        m = m2
    return m, l, O


def run_w(x, V, m, l0, l1, O):
    """W: WG0 owns block A (keys 0-63) and columns 0-255, WG1 block B and columns 256-511; each uses only its own
    scores and the other's maxima (smxa / smxb), in k_decode_w's order."""
    xa, xb = x[:, :64], x[:, 64:]
    smxa = [xa[:, :32].max(1).values, xa[:, 32:].max(1).values]  # WG0 -> WG1 (MXA)
    smxb = [xb[:, :32].max(1).values, xb[:, 32:].max(1).values]  # WG1 -> WG0 (BF)

    def factors(mxa, mxb):
        m1 = torch.maximum(m, mxa[0])
        m2 = torch.maximum(m1, mxa[1])
        m3 = torch.maximum(m2, mxb[0])
        m4 = torch.maximum(m3, mxb[1])
        return (m1, m2, m3, m4), (ex2(m - m1), ex2(m1 - m2), ex2(m2 - m3), ex2(m3 - m4))

    ms0, a0 = factors(smxa, smxb)  # WG0: A's maxima its own, B's from smxb
    ms1, a1 = factors(smxa, smxb)  # WG1: A's from smxa, B's its own
    assert all(torch.equal(u, v) for u, v in zip(ms0, ms1))
    PA0, PA1 = ex2(xa[:, :32] - ms0[0][:, None]), ex2(xa[:, 32:] - ms0[1][:, None])
    PB0, PB1 = ex2(xb[:, :32] - ms1[2][:, None]), ex2(xb[:, 32:] - ms1[3][:, None])
    l0 = (((l0 * a0[0] + PA0.sum(1)) * a0[1] + PA1.sum(1)) * a0[2]) * a0[3]
    l1 = (((l1 * a1[0]) * a1[1]) * a1[2] + PB0.sum(1)) * a1[3] + PB1.sum(1)
    halves = []
    for w, fac in ((0, a0), (1, a1)):
        Ow, cols = O[:, 256 * w:256 * w + 256], slice(256 * w, 256 * w + 256)
        for k, P in enumerate((PA0, PA1, PB0, PB1)):
            Ow = scale_warps(Ow, fac[k]) + P.bfloat16().float() @ V[32 * k:32 * k + 32, cols]
        halves.append(Ow)
    return ms0[3], l0, l1, torch.cat(halves, 1)


def check_numerics(trials=40):
    g = torch.Generator().manual_seed(11)
    bad = 0
    worst_l = 0.0
    for trial in range(trials):
        L = int(torch.randint(1, 700, (1,), generator=g))
        rounds = (L + 127) // 128
        m = torch.full((64,), -torch.inf)
        lt, l0, l1 = torch.zeros(64), torch.zeros(64), torch.zeros(64)
        Ot = Ow = torch.zeros(64, 512)
        mt = mw = m
        spread = float(torch.rand(1, generator=g)) * 40
        for r in range(rounds):
            drift = 3 * r if trial % 2 else 0
            S = torch.randn(64, 128, generator=g) * spread + torch.randn(64, 1, generator=g) * drift
            V = torch.randn(128, 512, generator=g).bfloat16().float()
            nvalid = L - 128 * r
            V[max(0, nvalid):] = 0  # zero-filled rows past the end (a missing block B is all zeros)
            x = torch.where(torch.arange(128)[None] < nvalid, S * 0.1 * 1.4426950408889634, torch.tensor(-torch.inf))
            mt, lt, Ot = run_tiles(x, V, mt, lt, Ot)
            mw, l0, l1, Ow = run_w(x, V, mw, l0, l1, Ow)
        lw = l0 + l1
        rel_l = ((lw - lt).abs() / lt).max().item()
        worst_l = max(worst_l, rel_l)
        finite = bool(torch.isfinite(Ow).all() and torch.isfinite(lw).all())
        if not (torch.equal(mt, mw) and torch.equal(Ot, Ow) and rel_l < 1e-5 and finite):
            bad += 1
            print(f"  trial {trial} L={L}: W differs: max |dO| {(Ot - Ow).abs().max().item():.3e}, l rel {rel_l:.2e}")
    return bad, worst_l


def main() -> int:
    bad = 0
    print("protocol (every interleaving of producer / WG0 / WG1):")
    for R in range(1, 5):
        try:
            n, finals, dl = check_protocol(R)
        except (Hazard, AssertionError) as e:
            print(f"  R={R}: HAZARD {e}")
            bad += 1
            continue
        print(f"  R={R}: {n} states, {finals} final, {len(dl)} deadlocked")
        bad += bool(dl) + (finals == 0)
    print("protocol mutants (must all be caught):")
    caught, total = mutants()
    bad += caught != total
    print("numerics (W's per-warpgroup programs vs the per-32-key-tile loop, float32, 40 random requests):")
    diff, worst_l = check_numerics()
    print(f"  {40 - diff} of 40 with m and O bit for bit equal, l within {worst_l:.1e} relative")
    bad += diff
    print("ALL PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
