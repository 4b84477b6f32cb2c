"""CPU checks of the decode probe's variants Z, Z3, F and FS (decode_wgmma_probe_z.cu) that need no GPU.

1. Protocol: the producer and the two consumer warpgroups as three programs of barrier operations (mbarrier
   arrive / parity wait, named-barrier bar.arrive / bar.sync with the hardware's counting: a generation completes
   when two warpgroups' worth of threads arrived, whoever they are), every interleaving explored (depth-first,
   states memoized) for 1..6 tiles, with one full barrier per stage (Z) and three (Z3). Checked: no deadlock (every interleaving ends with all three finished), no
   hazard on the shared buffers (a K stage refilled before both warpgroups released its tile, a P half or a row-
   maximum array overwritten before its reader finished, a read of the wrong tile's value), no named barrier
   completed by one side alone. A warpgroup is one actor: each of its generations needs all its 4 warps (the
   chain argument in the source's protocol comment), so per-warp drift cannot mix generations. Five broken
   variants of the protocol must be caught (a check that a mistake would show). Also the library's K = V FP8
   producer on TMA boxes (round s, programs_k): two producer warps and their TMA units as actors (a warp arrives on
   its landed barrier and issues; its unit lands the rows and completes it; the warp waits at the parity of its own
   count of uses, converts in place, arrives on full), with a warp falling back to cp.async at the last step and
   one at step 2, every interleaving for 1..6 steps; five broken forms must be caught (the conversion before the
   landed wait, the wait skipped, full arrived at the issue, the wait at the step's or the flipped parity).
2. Numerics: Z's per-warpgroup program (WG0: m1 from its own maxima, a2 from WG1's; WG1: m1 from WG0's
   maxima; own P half, row sums, O = (O·a1 + P0·V0)·a2 + P1·V1, each multiply skipped per 16-row warp when its
   factors are all 1) emulated in float32 torch against variant Y's order (both warpgroups compute m1, m2, a1, a2
   from both maxima; the a2 multiply skipped when every a2 of the CTA is 1) on random tiles with masked tails,
   rising and settled maxima: the float32 results must be bit for bit equal. (Z3's math is Z's.)
3. Variant FS (Z's consumers; the producer gathers a tile's E4M3 codes into the freed bf16 stage's upper half
   and converts them there in place). Its producer is k_sparse_s's op for op (the same code-block layout, thread
   mappings and three PROD barriers; the block table in place of the index list, no slot flags), so its
   in-place conversion and protocol are checked by sparse_wgmma_s_emulation.py's model, imported: the per-thread
   byte ranges (every code read finds its code, no byte stored in a phase read in that or a later phase, the
   stage ends as the slab layout), every interleaving of two producer halves and Z's two consumer warpgroups for
   1..6 tiles, and its seven broken variants. Added here, FS's own part: produce_fs's paged gather, its source
   and destination address per lane and copy, for page sizes 1, 48 and 64, splits starting on any 32-key
   boundary and tails past the length (every code byte of the tile from the right cache byte or zero-filled,
   written once), with three broken forms caught.

    python3 benchmarks/probes/decode_wgmma_z_emulation.py     # about a minute (FS's interleavings)
"""
import sys

import torch

# ------------------------------------------------------------------------------------------------------------
# 1. Protocol model. Ops: ("mwait", bar, parity), ("marrive", bar), ("arrive", id), ("sync", id), and buffer
# effects ("fill", i), ("release", i), ("write", buf, i), ("read", buf, i), ("read_begin", buf, i),
# ("read_end", buf, i), ("stage_use", i).


GROUPS = [1]  # full barriers per stage: 1 (variant Z) or 3 (Z3: one per slab group); 0: variant F (FP8 cache);
# -1: the library's K = V FP8 producer on TMA boxes (programs_k)


def programs(T):
    """The producer's, WG0's and WG1's operations for a split of T tiles, in k_decode_zt's program order."""
    G = GROUPS[0]
    if G == 0:
        return programs_f(T)
    if G == -1:
        return programs_k(T)
    return programs_z(T)


def programs_z(T):
    """Variant Z (or Z3 by GROUPS): the producer as one actor, the two consumer warpgroups."""
    G = max(GROUPS[0], 1)
    prod, w0, w1 = [], [], []
    for i in range(T):
        s = i & 1
        if i >= 2:
            prod.append(("mwait", f"empty{s}", ((i - 2) >> 1) & 1))
        prod += [("fill", i)] + [("marrive", f"full{s}_{g}") for g in range(G)]
    for w in (w0, w1):
        w.append(("sync", "ALL"))  # Q loaded
    for i in range(T):
        s = i & 1
        waits = [("mwait", f"full{s}_{g}", (i >> 1) & 1) for g in range(G)]
        w0 += waits + [("stage_use", i), ("write", "smx0", i), ("arrive", "MX0")]
        if i > 0:
            w0.append(("sync", "P0E"))
        w0 += [("write", "P0", i), ("arrive", "P0F"), ("sync", "H1F"), ("read", "smx1", i),
               ("read_begin", "P1", i), ("read_end", "P1", i), ("release", (0, i)), ("marrive", f"empty{s}")]
        w1 += waits + [("stage_use", i), ("sync", "MX0"), ("read", "smx0", i),
               ("write", "P1", i), ("write", "smx1", i), ("arrive", "H1F"), ("sync", "P0F"),
               ("read_begin", "P0", i), ("read_end", "P0", i)]
        if i + 1 < T:
            w1.append(("arrive", "P0E"))
        w1 += [("release", (1, i)), ("marrive", f"empty{s}")]
    w0 += [("write", "sl0", 0), ("sync", "ALL"), ("read", "sl1", 0)]
    w1 += [("write", "sl1", 0), ("sync", "ALL"), ("read", "sl0", 0)]
    return [prod, w0, w1]


def programs_f(T):
    """Variant F: the producer fills code stage i % 2; each warpgroup, at the start of step i, waits ALL (i > 0:
    both finished step i - 1), waits full, converts its share of tile i into the one bf16 stage (kb_write),
    releases the code stage (empty), waits ALL again, then runs Z's step on the bf16 stage (kb_use ... kb_done)
    with no release at the end."""
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
        for w in (w0, w1):
            if i > 0:
                w.append(("sync", "ALL"))
            w += [("mwait", f"full{s}_0", (i >> 1) & 1), ("stage_use", i), ("kb_write", i),
                  ("release", (0 if w is w0 else 1, i)), ("marrive", f"empty{s}"), ("sync", "ALL"), ("kb_use", i)]
        w0 += [("write", "smx0", i), ("arrive", "MX0")]
        if i > 0:
            w0.append(("sync", "P0E"))
        w0 += [("write", "P0", i), ("arrive", "P0F"), ("sync", "H1F"), ("read", "smx1", i),
               ("read_begin", "P1", i), ("read_end", "P1", i), ("kb_done", i)]
        w1 += [("sync", "MX0"), ("read", "smx0", i), ("write", "P1", i), ("write", "smx1", i), ("arrive", "H1F"),
               ("sync", "P0F"), ("read_begin", "P0", i), ("read_end", "P0", i)]
        if i + 1 < T:
            w1.append(("arrive", "P0E"))
        w1.append(("kb_done", i))
    w0 += [("write", "sl0", 0), ("sync", "ALL"), ("read", "sl1", 0)]
    w1 += [("write", "sl1", 0), ("sync", "ALL"), ("read", "sl0", 0)]
    return [prod, w0, w1]


def k_tma(w, i, T):
    """programs_k's pattern: whether producer warp w loads step i by TMA. Warp 0: every step but the last (a length
    ending inside its rows); warp 1: every step but step 2 (a page outside the cache), so its later uses of stage 0's
    landed barrier are one phase behind the step count."""
    return i != T - 1 if w == 0 else i != 2


K_LANDED_PARITY = ["count"]  # "count": the kernel's landed_par; "step": (i >> 1) & 1 (broken); "flipped" (broken)


def programs_k(T, convert_first=False, skip_wait=False, full_at_issue=False):
    """K = V FP8 on TMA (decode_wgmma_body, KF = kFP8): two producer warps (rows 0-15, 16-31; the other two alike),
    each with its TMA unit as an actor, and Z's two consumer warpgroups. Warp w, step i, stage s = i % 2: the empty
    wait (i >= 2); by TMA (k_tma): its arrival on landed{s}_w (lane 0's expect_tx and the 31 others: one arrival
    here, the unit's complete_tx the second), the issue, then the wait on landed{s}_w at the parity of its own count
    of uses (the kernel's landed_par), the in-place conversion and its arrival on full{s}; else its copies land
    (cp.async.wait_group), the conversion, the arrival. The unit lands the rows once issued, then arrives. Broken
    forms: convert_first (the conversion before the landed wait), skip_wait, full_at_issue (kNoQuant's protocol:
    full arrived at the issue), K_LANDED_PARITY "step" / "flipped"."""
    prods, units = [[], []], [[], []]
    for w in (0, 1):
        uses = [0, 0]
        for i in range(T):
            s = i & 1
            if i >= 2:
                prods[w].append(("mwait", f"empty{s}", ((i - 2) >> 1) & 1))
            if not k_tma(w, i, T):
                prods[w] += [("land", w, i), ("convert", w, i), ("marrive", f"full{s}_0")]
                continue
            par = {"count": uses[s] & 1, "step": (i >> 1) & 1, "flipped": 1 - (uses[s] & 1)}[K_LANDED_PARITY[0]]
            uses[s] += 1
            wait = [] if skip_wait else [("mwait", f"landed{s}_{w}", par)]
            conv = [("convert", w, i)]
            prods[w] += [("marrive", f"landed{s}_{w}"), ("issue", w, i)]
            if full_at_issue:
                prods[w] += [("marrive", f"full{s}_0")] + wait + conv
            else:
                prods[w] += (conv + wait if convert_first else wait + conv) + [("marrive", f"full{s}_0")]
            units[w] += [("await_issue", w, i), ("land", w, i), ("marrive", f"landed{s}_{w}")]
    _, w0, w1 = programs_z(T)
    return [prods[0], prods[1], units[0], units[1], w0, w1]


MB_COUNT = {"empty0": 2, "empty1": 2}  # in actors (2 x 4 warps); every full barrier: 1 (128 producer threads)
MB_COUNT_K = {"full0_0": 2, "full1_0": 2, **{f"landed{s}_{w}": 2 for s in (0, 1) for w in (0, 1)}}


class Hazard(Exception):
    """A shared buffer used out of order, or a named barrier completed by one side alone."""


def check_protocol(T):
    """Every interleaving for T tiles: (states, finished interleavings' end states, deadlocked states); raises
    Hazard on a buffer hazard or a generation completed by arrivals alone."""
    progs = programs(T)
    # state: pcs, waiting (actor -> (id, gen)), named {id: (count, gen)}, mbar {name: (pending, phase)},
    # bufs {name: (value, consumed)}, stage {s: (tile, released set)}
    init = (
        tuple(0 for _ in progs),
        frozenset(),
        frozenset(),
        frozenset(),
        frozenset(),
        frozenset(),
    )
    seen = set()
    deadlocks = []
    stack = [init]
    finals = 0

    def unpack(st):
        pcs, waiting, named, mbar, bufs, stage = st
        return list(pcs), dict(waiting), dict(named), dict(mbar), dict(bufs), dict(stage)

    def pack(pcs, waiting, named, mbar, bufs, stage):
        return (tuple(pcs), frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                frozenset(bufs.items()), frozenset(stage.items()))

    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        pcs, waiting, named, mbar, bufs, stage = unpack(st)
        if all(pcs[a] == len(progs[a]) for a in range(len(progs))) and not waiting:
            finals += 1
            assert all(c == 0 for c, _ in named.values()), f"barrier left open at exit: {named}"
            continue
        moved = False
        for a in range(len(progs)):
            if pcs[a] == len(progs[a]):
                continue
            pcs2, waiting2, named2, mbar2, bufs2, stage2 = unpack(st)
            if a in waiting2:  # blocked in bar.sync until its generation completes
                bid, gen = waiting2[a]
                if named2.get(bid, (0, 0))[1] == gen:
                    continue
                del waiting2[a]
                pcs2[a] += 1
                stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2, stage2))
                moved = True
                continue
            op = progs[a][pcs[a]]
            kind = op[0]
            if kind == "mwait":  # try_wait.parity: passes once the phase of this parity has completed
                pending, phase = mbar2.get(op[1], (0, 0))
                if (phase & 1) == op[2]:
                    continue
            elif kind == "marrive":
                pending, phase = mbar2.get(op[1], (0, 0))
                pending += 1
                if pending == (MB_COUNT_K if GROUPS[0] == -1 else {}).get(op[1], MB_COUNT.get(op[1], 1)):
                    pending, phase = 0, phase + 1
                mbar2[op[1]] = (pending, phase)
            elif kind in ("arrive", "sync"):  # one actor = one warpgroup = half of a generation
                count, gen = named2.get(op[1], (0, 0))
                if count + 1 == 2:
                    if kind == "arrive" and not any(w[0] == op[1] for w in waiting2.values()):
                        raise Hazard(f"T={T}: barrier {op[1]} completed by arrivals alone (actor {a} arrived twice)")
                    named2[op[1]] = (0, gen + 1)  # waiters of generation `gen` released; a sync passes at once
                else:
                    named2[op[1]] = (count + 1, gen)
                    if kind == "sync":
                        waiting2[a] = (op[1], gen)
                        stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2, stage2))
                        moved = True
                        continue
            elif kind == "fill":
                i = op[1]
                s = i & 1
                tile, rel = stage2.get(s, (None, frozenset()))
                if tile is not None and rel != frozenset({0, 1}):
                    raise Hazard(f"T={T}: stage {s} refilled with tile {i} before tile {tile} was released")
                stage2[s] = (i, frozenset())
            elif kind == "slot_fill":  # ring4: ("slot_fill", slot, i): the slot's rows of step i (its own ring)
                _, slot, i = op
                tile, rel = stage2.get(("slot", slot), (None, frozenset()))
                if tile is not None and rel != frozenset({0, 1}):
                    raise Hazard(f"T={T}: slot {slot} refilled with step {i} before step {tile} was released")
                stage2[("slot", slot)] = (i, frozenset())
            elif kind == "slot_use":  # ("slot_use", slot, i, w): warpgroup w reads the slot's rows of step i
                tile, rel = stage2.get(("slot", op[1]), (None, frozenset()))
                if tile != op[2] or op[3] in rel:
                    raise Hazard(f"T={T}: actor {a} read slot {op[1]} holding step {tile}, wanted {op[2]} "
                                 f"(released by {sorted(rel)})")
            elif kind == "slot_release":  # ("slot_release", slot, (w, i)): warpgroup w's last read of it done
                _, slot, (w, i) = op
                tile, rel = stage2[("slot", slot)]
                assert tile == i
                stage2[("slot", slot)] = (tile, rel | {w})
            elif kind == "await_issue":  # a TMA unit: its warp issued the boxes of step op[2]
                if bufs2.get(("issued", op[1]), -1) < op[2]:
                    continue
            elif kind == "issue":
                bufs2[("issued", op[1])] = op[2]
            elif kind == "land":  # K mode: warp w's rows of step i written into stage i % 2 (TMA unit or cp.async)
                _, w, i = op
                tile, rel, _ = stage2.get(("rows", i & 1, w), (None, frozenset(), False))
                if tile is not None and rel != frozenset({0, 1}):
                    raise Hazard(f"T={T}: warp {w}'s rows of stage {i & 1} refilled with step {i} before step {tile} "
                                 "was released")
                stage2[("rows", i & 1, w)] = (i, frozenset(), False)
            elif kind == "convert":  # K mode: warp w converts its rows of step i in place
                _, w, i = op
                tile, rel, done = stage2.get(("rows", i & 1, w), (None, frozenset(), False))
                if tile != i or done:
                    raise Hazard(f"T={T}: warp {w} converts its rows of step {i} while stage {i & 1} holds step "
                                 f"{tile}{' (converted)' if done else ''}: the boxes had not landed")
                stage2[("rows", i & 1, w)] = (i, rel, True)
            elif kind == "stage_use" and GROUPS[0] == -1:
                for w in (0, 1):
                    tile, rel, done = stage2.get(("rows", op[1] & 1, w), (None, frozenset(), False))
                    if tile != op[1] or not done:
                        raise Hazard(f"T={T}: actor {a} used warp {w}'s rows of stage {op[1] & 1} holding step "
                                     f"{tile}{'' if done else ' unconverted'}, wanted {op[1]}")
            elif kind == "release" and GROUPS[0] == -1:
                w, i = op[1]
                for pw in (0, 1):
                    tile, rel, done = stage2[("rows", i & 1, pw)]
                    assert tile == i
                    stage2[("rows", i & 1, pw)] = (tile, rel | {w}, done)
            elif kind == "stage_use":
                tile, _ = stage2.get(op[1] & 1, (None, None))
                if tile != op[1]:
                    raise Hazard(f"T={T}: actor {a} used stage {op[1] & 1} holding tile {tile}, wanted {op[1]}")
            elif kind == "release":
                w, i = op[1]
                tile, rel = stage2[i & 1]
                assert tile == i
                stage2[i & 1] = (tile, rel | {w})
            elif kind == "write":
                val, consumed = bufs2.get(op[1], (None, True))
                if not consumed:
                    raise Hazard(f"T={T}: {op[1]} overwritten with tile {op[2]} before tile {val} was read")
                bufs2[op[1]] = (op[2], False)
            elif kind in ("read", "read_begin"):
                val, consumed = bufs2.get(op[1], (None, True))
                if val != op[2]:
                    raise Hazard(f"T={T}: {op[1]} read for tile {op[2]} holds {val}")
                if kind == "read":
                    bufs2[op[1]] = (val, True)
            elif kind == "read_end":
                val, _ = bufs2[op[1]]
                bufs2[op[1]] = (val, True)
            elif kind == "kb_write":  # F: this warpgroup's share of tile i into the bf16 stage
                i = op[1]
                for w in (0, 1):  # both warpgroups finished reading tile i - 1 from it
                    if bufs2.get(("kb_done", w), -1) < i - 1:
                        raise Hazard(f"T={T}: actor {a} converts tile {i} while warpgroup {w} still reads tile {i - 1}")
                bufs2[("kb_written", a)] = i
            elif kind == "kb_use":  # F: the whole tile i is in the bf16 stage
                i = op[1]
                if any(bufs2.get(("kb_written", w), -1) != i for w in (1, 2)):
                    raise Hazard(f"T={T}: actor {a} reads tile {i} from the bf16 stage before both converted it")
            elif kind == "kb_done":
                bufs2[("kb_done", a - 1)] = op[1]
            pcs2[a] += 1
            stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2, stage2))
            moved = True
        if not moved:
            deadlocks.append((pcs, {a: progs[a][pcs[a]] for a in range(len(progs)) if pcs[a] < len(progs[a])}))
    return len(seen), finals, deadlocks


def first_failure(max_steps):
    """The first failure of check_protocol over 1..max_steps steps (a hazard, an assertion or a deadlock), or None."""
    for T in range(1, max_steps + 1):
        try:
            _, _, dl = check_protocol(T)
            if dl:
                return f"deadlock at T={T}"
        except (Hazard, AssertionError) as e:
            return str(e)
    return None


def check_protocol_mutants_f():
    """F's mistakes the checker must catch: no barrier before the conversion (a warpgroup overwrites the bf16
    stage while the other still reads the previous tile), no barrier after it (S reads a half-converted tile)."""
    global programs_f
    orig = programs_f
    caught = 0

    def no_first_sync(T):
        p = orig(T)
        for w in (p[1], p[2]):
            for i in range(1, T):
                k = w.index(("kb_write", i))
                assert w[k - 3] == ("sync", "ALL")
                w.pop(k - 3)
        return p

    def no_second_sync(T):
        p = orig(T)
        for w in (p[1], p[2]):
            for i in range(T):
                k = w.index(("kb_use", i))
                assert w[k - 1] == ("sync", "ALL")
                w.pop(k - 1)
        return p

    for name, fn in [("no barrier before the conversion", no_first_sync),
                     ("no barrier after the conversion", no_second_sync)]:
        programs_f = fn
        found = first_failure(4)
        programs_f = orig
        print(f"  mutant '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    return caught


def check_protocol_mutants():
    """The checker must catch the classic mistakes: no empty-barrier skip on tile 0, an arrive on the last tile,
    smx1 written before the MX0 wait (the reason it sits after it), waiting for a stage with the wrong parity,
    the P0 slab half rewritten without the P0E barrier."""
    caught = 0
    global programs
    orig = programs

    def mut(fn):
        def wrapped(T):
            return fn(orig(T), T)
        return wrapped

    def no_skip(p, T):  # WG0 waits P0E on tile 0 too
        w0 = p[1]
        k = next(j for j, op in enumerate(w0) if op == ("write", "P0", 0))
        w0.insert(k, ("sync", "P0E"))
        return p

    def smx1_early(p, T):  # WG1 writes smx1 right after its S, before the P1E wait
        w1 = p[2]
        for i in range(T):
            k = w1.index(("write", "smx1", i))
            w1.pop(k)
            k2 = w1.index(("stage_use", i))
            w1.insert(k2 + 1, ("write", "smx1", i))
        return p

    def bad_parity(p, T):  # consumers wait full with parity i & 1 instead of (i >> 1) & 1
        for w in (p[1], p[2]):
            for j, op in enumerate(w):
                if op[0] == "mwait":
                    i = 2 * op[2] + (1 if op[1].startswith("full1") else 0)
                    w[j] = ("mwait", op[1], 1 - op[2] if i >= 2 else op[2])
        return p

    def no_p0_empty(p, T):  # WG0 never waits for WG1's P0·V0_R before rewriting P0 (and WG1 never arrives)
        p[1][:] = [op for op in p[1] if op != ("sync", "P0E")]
        p[2][:] = [op for op in p[2] if op != ("arrive", "P0E")]
        return p

    def p0e_last(p, T):  # WG1 arrives at P0E on the last tile too: a generation left open at exit
        w1 = p[2]
        k = w1.index(("read_end", "P0", T - 1))
        w1.insert(k + 1, ("arrive", "P0E"))
        return p

    for name, fn in [("P0E waited on tile 0", no_skip), ("smx1 written early", smx1_early),
                     ("full waited with parity i & 1", bad_parity), ("no P0-empty barrier", no_p0_empty),
                     ("P0E arrived at on the last tile", p0e_last)]:
        programs = mut(fn)
        found = first_failure(5)
        programs = orig
        print(f"  mutant '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    return caught


def check_protocol_mutants_k():
    """The K = V FP8 TMA producer's mistakes the checker must catch (programs_k's broken forms)."""
    global programs_k
    orig = programs_k
    caught = 0
    cases = [("conversion before the landed wait", dict(convert_first=True), "count"),
             ("landed wait skipped", dict(skip_wait=True), "count"),
             ("full arrived at the issue (kNoQuant's protocol)", dict(full_at_issue=True), "count"),
             ("landed wait at the step's parity (i >> 1) & 1", {}, "step"),
             ("landed wait at the flipped parity", {}, "flipped")]
    for name, kw, parity in cases:
        programs_k = lambda T, kw=kw: orig(T, **kw)  # noqa: E731
        K_LANDED_PARITY[0] = parity
        found = first_failure(6)
        programs_k = orig
        K_LANDED_PARITY[0] = "count"
        print(f"  mutant '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    return caught, len(cases)


# ------------------------------------------------------------------------------------------------------------
# 2. Numerics: Z's per-warpgroup order vs Y's, float32, bit for bit.


def ex2(x):
    return torch.exp2(x)


def run_y(S, V, m, l0, l1, O, nvalid, scale_log2):
    """Variant Y on one 64-key tile: S [64 rows, 64 keys] float32 scores, V [64 keys, 512]; returns new state."""
    cols = torch.arange(32)
    x = [torch.where(cols[None] < nvalid - 32 * w, S[:, 32 * w:32 * w + 32] * scale_log2, torch.tensor(-torch.inf))
         for w in (0, 1)]
    mx0, mx1 = x[0].max(1).values, x[1].max(1).values
    m1 = torch.maximum(m, mx0)
    m2 = torch.maximum(m1, mx1)
    a1, a2 = ex2(m - m1), ex2(m1 - m2)
    P0, P1 = ex2(x[0] - m1[:, None]), ex2(x[1] - m2[:, None])
    l0 = (l0 * a1 + P0.sum(1)) * a2
    l1 = (l1 * a1) * a2 + P1.sum(1)
    O = O * a1[:, None]
    O = O + P0.bfloat16().float() @ V[:32]
    if bool((a2 != 1).any()):
        O = O * a2[:, None]
    O = O + P1.bfloat16().float() @ V[32:]
    return m2, l0, l1, O


SKIPPED = [0, 0]  # warp rescales done, skipped


def scale_warps(O, a):
    """O [64, 256] times a [64] per row, skipped for a warp's 16 rows when all their factors are 1."""
    parts = []
    for w in range(4):
        rows = slice(16 * w, 16 * w + 16)
        skip = not bool((a[rows] != 1).any())
        SKIPPED[int(skip)] += 1
        parts.append(O[rows] if skip else O[rows] * a[rows, None])
    return torch.cat(parts)


def run_z(S, V, m, l0, l1, O, nvalid, scale_log2):
    """Variant Z: the two warpgroups' programs, each with only what it gets through shared memory."""
    cols = torch.arange(32)
    x0 = torch.where(cols[None] < nvalid, S[:, :32] * scale_log2, torch.tensor(-torch.inf))
    x1 = torch.where(cols[None] < nvalid - 32, S[:, 32:] * scale_log2, torch.tensor(-torch.inf))
    smx0 = x0.max(1).values  # WG0 -> WG1 (MX0)
    mx1_wg1 = x1.max(1).values
    # WG1 (after MX0): its m1 from WG0's maxima, its own P1 and row sum
    m1_w1 = torch.maximum(m, smx0)
    m2_w1 = torch.maximum(m1_w1, mx1_wg1)
    a1_w1, a2_w1 = ex2(m - m1_w1), ex2(m1_w1 - m2_w1)
    P1 = ex2(x1 - m2_w1[:, None])
    l1 = (l1 * a1_w1) * a2_w1 + P1.sum(1)
    smx1 = mx1_wg1  # WG1 -> WG0 (H1F)
    # WG0: m1 from its own maxima, a2 after H1F
    m1_w0 = torch.maximum(m, smx0)
    a1_w0 = ex2(m - m1_w0)
    P0 = ex2(x0 - m1_w0[:, None])
    m2_w0 = torch.maximum(m1_w0, smx1)
    a2_w0 = ex2(m1_w0 - m2_w0)
    l0 = (l0 * a1_w0 + P0.sum(1)) * a2_w0
    # O columns: left half by WG0 with its factors, right half by WG1 with its own (P0 read from the slab); each
    # warp (16 rows) skips a multiply when all its rows' factors are exactly 1
    OL, OR = O[:, :256], O[:, 256:]
    OL = scale_warps(scale_warps(OL, a1_w0) + P0.bfloat16().float() @ V[:32, :256], a2_w0) + \
        P1.bfloat16().float() @ V[32:, :256]
    OR = scale_warps(scale_warps(OR, a1_w1) + P0.bfloat16().float() @ V[:32, 256:], a2_w1) + \
        P1.bfloat16().float() @ V[32:, 256:]
    assert torch.equal(m2_w0, m2_w1)
    return m2_w0, l0, l1, torch.cat([OL, OR], 1)


def check_numerics():
    g = torch.Generator().manual_seed(9)
    worst = 0
    for trial in range(40):
        L = int(torch.randint(1, 640, (1,), generator=g))
        steps = (L + 63) // 64
        m = torch.full((64,), -torch.inf)
        l0y = l1y = l0z = l1z = torch.zeros(64)
        Oy = Oz = torch.zeros(64, 512)
        my = mz = m
        spread = float(torch.rand(1, generator=g)) * 40  # scores from flat to peaked
        for it in range(steps):
            drift = 3 * it if trial % 2 else 0  # rising maxima (rescales) or settled ones (skipped rescales)
            S = torch.randn(64, 64, generator=g) * spread + torch.randn(64, 1, generator=g) * drift
            V = torch.randn(64, 512, generator=g).bfloat16().float()
            nvalid = L - 64 * it
            V[max(0, nvalid):] = 0  # zero-filled rows past the end
            my, l0y, l1y, Oy = run_y(S, V, my, l0y, l1y, Oy, nvalid, 1.4426950408889634 * 0.1)
            mz, l0z, l1z, Oz = run_z(S, V, mz, l0z, l1z, Oz, nvalid, 1.4426950408889634 * 0.1)
        same = (torch.equal(my, mz) and torch.equal(l0y, l0z) and torch.equal(l1y, l1z) and torch.equal(Oy, Oz))
        if not same:
            worst += 1
            print(f"  trial {trial} L={L}: Z differs from Y: max |dO| {(Oy - Oz).abs().max().item():.3e}")
    return worst


# ------------------------------------------------------------------------------------------------------------
# 3. Variant FS.

KD, CODE_OFF_FS, BLOCK_FS = 576, 36864, 4096


def fs_gather(P, bt, start, end, i, page_mod=None, src_step=64, row_b=8):
    """produce_fs's copies for tile i: {stage byte: cache byte or None (zero-filled)}, as the kernel computes
    them (lanes 0-15 of warp pw hold rows 16pw + lane; lane l copies chunk q = l % 4 of every code block k for rows
    16pw + l/4 and + row_b, from offset + 16q + src_step * k). page_mod, src_step, row_b: broken forms."""
    mod = page_mod or P
    out = {}
    for pw in range(4):
        my_off = []
        for lane in range(16):
            pos = start + 64 * i + 16 * pw + lane
            my_off.append((bt[pos // P] * P + pos % mod) * KD if pos < end else -1)
        for lane in range(32):
            q, gr = lane & 3, 16 * pw + (lane >> 2)
            for row, off in ((gr, my_off[lane >> 2]), (gr + row_b, my_off[((lane >> 2) + row_b) % 16])):
                for k in range(9):
                    dst = CODE_OFF_FS + BLOCK_FS * k + 64 * row + 16 * q
                    for b in range(16):
                        if dst + b in out:
                            raise Hazard(f"stage byte {dst + b} written twice")
                        out[dst + b] = off + 16 * q + src_step * k + b if off >= 0 else None
    return out


def check_fs_gather(**broken):
    """Every tile of a few requests (page sizes 1, 48, 64; splits starting on 32-key boundaries; lengths off the
    64-key edges): code byte c of tile row r at CODE_OFF + 4096 (c // 64) + 64 r + c % 64 comes from the cache
    byte of key start + 64 i + r (through the block table), or is zero past `end`. Returns the first error."""
    g = torch.Generator().manual_seed(10)
    for P in (1, 48, 64):
        for start, end in ((0, 1), (0, 130), (32, 257), (96, 200), (64 * 3 + 32, 64 * 3 + 32 + 64 * 2 + 17)):
            pages = (end + P - 1) // P
            bt = torch.randperm(4 * pages + 3, generator=g)[:pages].tolist()
            for i in range((end - start + 63) // 64):
                got = fs_gather(P, bt, start, end, i, **broken)
                if len(got) != 64 * KD:
                    return f"P={P} start={start} tile {i}: {len(got)} code bytes written, want {64 * KD}"
                for r in range(64):
                    pos = start + 64 * i + r
                    base = (bt[pos // P] * P + pos % P) * KD if pos < end else None
                    for c in range(0, KD, 7):
                        want = base + c if base is not None else None
                        a = CODE_OFF_FS + BLOCK_FS * (c // 64) + 64 * r + c % 64
                        if got.get(a, "unwritten") != want:
                            return f"P={P} start={start} end={end} tile {i} row {r} col {c}: {got.get(a)} != {want}"
    return None


def check_fs():
    """Variant FS: S's model (imported) for the in-place conversion and the protocol, then FS's paged gather."""
    import sparse_wgmma_s_emulation as s  # imports this module's Z programs for the consumers

    bad = 0
    errors = s.check_layout()
    print(f"  in-place conversion, byte ranges (S's model): {'OK' if not errors else 'FAIL: ' + '; '.join(errors[:3])}")
    bad += bool(errors)
    for T in range(1, 7):
        try:
            n, finals, dl = s.check_protocol(T)
        except (s.Hazard, AssertionError) as e:
            print(f"  T={T}: HAZARD {e}")
            bad += 1
            continue
        print(f"  T={T}: {n} states, {finals} final, {len(dl)} deadlocked")
        bad += bool(dl) + (finals == 0)
    print("  broken variants of the in-place protocol (S's, must all be caught):")
    bad += s.check_mutants() != len(s.MUTANTS)
    err = check_fs_gather()
    print(f"  paged gather (page sizes 1, 48, 64): {'OK' if err is None else 'FAIL: ' + err}")
    bad += err is not None
    for name, broken in [("pos % 64 for the in-page row", {"page_mod": 64}),
                         ("code blocks 16 B apart in the row", {"src_step": 16}),
                         ("second row 4 below the first", {"row_b": 4})]:
        try:
            err = check_fs_gather(**broken)
        except Hazard as e:
            err = str(e)
        print(f"  broken gather '{name}': {'caught: ' + err if err else 'NOT caught'}")
        bad += err is None
    return bad


def main() -> int:
    bad = 0
    for G in (1, 3, 0, -1):
        GROUPS[0] = G
        what = {0: "variant F (FP8 cache)", -1: "K = V FP8 on TMA, landed barriers (two producer warps, their TMA "
                "units, WG0, WG1)"}.get(G, f"{G} full barrier(s) per stage")
        print(f"protocol, {what} (every interleaving):")
        for T in range(1, 7):
            try:
                n, finals, dl = check_protocol(T)
            except (Hazard, AssertionError) as e:
                print(f"  T={T}: HAZARD {e}")
                bad += 1
                continue
            print(f"  T={T}: {n} states, {finals} final, {len(dl)} deadlocked")
            bad += bool(dl) + (finals == 0)
    GROUPS[0] = 1
    print("protocol mutants (must all be caught):")
    caught = check_protocol_mutants()
    bad += caught != 5
    GROUPS[0] = 0
    print("variant F protocol mutants (must all be caught):")
    bad += check_protocol_mutants_f() != 2
    GROUPS[0] = -1
    print("K = V FP8 TMA producer's protocol mutants (must all be caught):")
    caught, total = check_protocol_mutants_k()
    bad += caught != total
    GROUPS[0] = 1
    print("numerics (Z's per-warpgroup order vs Y's, float32, 40 random requests):")
    diff = check_numerics()
    print(f"  {40 - diff} of 40 bit for bit equal ({SKIPPED[1]} warp rescales skipped, {SKIPPED[0]} done)")
    bad += diff
    print("variant FS (producer converts in place):")
    bad += check_fs()
    print("ALL PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
