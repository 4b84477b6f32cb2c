"""CPU check of the synchronization protocol of the WGMMA prefill probe (prefill_wgmma_probe.cu), no GPU needed.

The producer warpgroup and the two consumer warpgroups as three programs of barrier operations, in the kernel's
program order: mbarrier arrive / parity wait (a wait on parity p passes once the phase of parity p completed,
i.e. while the phase in progress has the other parity, which is how try_wait.parity behaves: a phase
overtaken twice shows up as a hang or a wrong read), named-barrier bar.arrive / bar.sync with the
hardware's counting (a generation completes when two warpgroups' worth of threads arrived, whoever they are).
Every interleaving is explored (depth-first, states memoized) for 1..8 tiles and 3..5 stages, with the turn
barriers (variants BF16, P8) and without (NOPP), and for the TMA producer (variants TMA, TMA8: one thread issues
tile i's copies after the empty wait, no lag; each copy's landing, which completes its full barrier, is a fourth
actor that fires the pending landings in any order) for 2..4 stages. Checked:
  - no deadlock: every interleaving ends with all three programs finished (and no copy pending);
  - no stage refilled before both consumers released the tile in it (their reads run from the wgmma issue to
    the release after wgmma.wait_group 0, modelled as one interval), no tile read from a stage that holds
    another tile or that was not yet published (K and V each on their own barrier);
  - no named-barrier generation completed by one side alone or by two arrivals, none left open at the end.
A warpgroup is one actor: each generation of a 256-thread named barrier needs all 4 warps of both sides, and the
per-warp empty arrivals come after the warp's own wait (modelled as one arrival per warpgroup, count 2).
Broken variants of the protocol must be caught (a check that a mistake would show). Then the persistent variant
of round 2 (89103da: work items from a counter, a Q / item slot between items; see below), its own broken variants.

    python3 benchmarks/probes/prefill_wgmma_emulation.py     # about 25 s
"""
import sys

sys.setrecursionlimit(100000)


def programs(n, stages, mutant=None, pingpong=True, tma=False):
    """The producer's, WG0's and WG1's operations for a CTA of n key tiles, in k_prefill's program order
    (pingpong False: variant NOPP, without the turn barriers; tma: the TMA producer, whose "land" operation hands
    the tile's barrier completions to the copy engine)."""
    prod = []
    for i in range(n if tma else 0):
        s = i % stages
        if i >= stages and mutant != "no_empty_wait":
            prod.append(("mwait", f"empty{s}", (i // stages - 1) & 1))
        prod.append(("fill", i))
        landings = [("marrive", "fullQ", None)] if i == 0 else []
        landings += [("marrive", f"fullK{s}", ("K", i)), ("marrive", f"fullV{s}", ("V", i))]
        prod.append(("land", tuple(landings)))
    for i in range(0 if tma else n):
        s = i % stages
        if i >= stages and mutant != "no_empty_wait":
            prod.append(("mwait", f"empty{s}", (i // stages - 1) & 1))
        prod.append(("fill", i))  # cp.async of (Q,) K_i, V_i into stage s
        if i >= 1:  # wait_group 2: tile i-1 landed; publish it
            if i == 1:
                prod.append(("marrive", "fullQ", None))
            prod.append(("marrive", f"fullK{(i - 1) % stages}", ("K", i - 1)))
            prod.append(("marrive", f"fullV{(i - 1) % stages}", ("V", i - 1)))
    if not tma:
        if n == 1:
            prod.append(("marrive", "fullQ", None))
        prod.append(("marrive", f"fullK{(n - 1) % stages}", ("K", n - 1)))
        prod.append(("marrive", f"fullV{(n - 1) % stages}", ("V", n - 1)))

    cons = []
    for w in (0, 1):
        mine, other = f"TURN{w}", f"TURN{1 - w}"
        c = [("mwait", "fullQ", 0)]
        if pingpong and w == 1 and mutant != "no_initial_arrive":
            c.append(("arrive", "TURN0"))
        c += [("mwait", "fullK0", 0)] + [("sync", mine)] * pingpong + [("read", "K", 0)]
        if pingpong and (w == 0 or n > 1 or mutant == "extra_arrive"):
            c.append(("arrive", other))
        for j in range(1, n):
            kpar = (j // stages) & 1
            if mutant == "wrong_parity" and w == 1:
                kpar ^= 1
            c += [("mwait", f"fullK{j % stages}", kpar), ("mwait", f"fullV{(j - 1) % stages}", ((j - 1) // stages) & 1)]
            if mutant == "early_release":
                c.append(("release", j - 1))
            c += [("sync", mine)] * pingpong + [("read", "K", j), ("read", "V", j - 1)]
            if pingpong and (w == 0 or j < n - 1 or mutant == "extra_arrive"):
                c.append(("arrive", other))
            if mutant != "early_release":
                c.append(("release", j - 1))
        c += [("mwait", f"fullV{(n - 1) % stages}", ((n - 1) // stages) & 1), ("read", "V", n - 1),
              ("release", n - 1)]
        cons.append(c)
    return [prod] + cons


class Hazard(Exception):
    """A stage used out of order, or a named barrier generation completed wrongly."""


def explore(n, stages, mutant=None, pingpong=True, tma=False):
    """Every interleaving for n tiles: returns (states visited, deadlocked states); raises Hazard."""
    progs = programs(n, stages, mutant, pingpong, tma)
    mb_count = {f"empty{s}": 2 for s in range(stages)}  # the two consumer warpgroups; full*: 1 (the producer)
    # state: pcs, waiting {actor: (id, gen)}, named {id: (members, gen)}, mbar {name: (pending, completed)},
    # stage {s: (tile, K published, V published, released-by)}, reading {(actor, tile)}, landings {pending
    # TMA barrier completions}; actor 3 is the copy engine
    init = ((0, 0, 0), frozenset(), frozenset(), frozenset(), frozenset(), frozenset(), frozenset())
    seen, dead = set(), []

    def step(state, a, landing=None):
        pcs, waiting, named, mbar, stage, reading, landings = state
        waiting, named, mbar, stage = dict(waiting), dict(named), dict(mbar), dict(stage)
        reading, landings = set(reading), set(landings)
        if landing is not None:  # the copy engine: one pending copy lands, its barrier phase completes
            landings.discard(landing)
            op = landing
        elif a in waiting:  # blocked in bar.sync until its generation completes
            bid, gen = waiting[a]
            if named.get(bid, ((), 0))[1] == gen:
                return None
            del waiting[a]
            return (pcs, frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                    frozenset(stage.items()), frozenset(reading), frozenset(landings))
        elif pcs[a] >= len(progs[a]):
            return None
        else:
            op = progs[a][pcs[a]]
        kind = op[0]
        if kind == "mwait":
            _, name, parity = op
            completed = mbar.get(name, (0, 0))[1]
            if completed & 1 == parity:  # the phase in progress has this parity: not completed yet
                return None
        elif kind == "marrive":
            _, name, what = op
            if what is not None:  # publish K or V of a tile: the stage must hold it
                part, tile = what
                s = tile % stages
                t, kp, vp, rel = stage.get(s, (None, False, False, frozenset()))
                if t != tile:
                    raise Hazard(f"{name}: publishes tile {tile} but stage {s} holds {t}")
                stage[s] = (t, kp or part == "K", vp or part == "V", rel)
            pending, completed = mbar.get(name, (0, 0))
            pending += 1
            if pending == mb_count.get(name, 1):
                pending, completed = 0, completed + 1
            mbar[name] = (pending, completed)
        elif kind == "land":
            landings.update(op[1])
        elif kind == "fill":
            tile = op[1]
            s = tile % stages
            if s in stage:
                t, _, _, rel = stage[s]
                if rel != frozenset((1, 2)):
                    raise Hazard(f"stage {s} refilled with tile {tile} before both consumers released tile {t}")
            if any(t % stages == s for (_, t) in reading):
                raise Hazard(f"stage {s} refilled with tile {tile} while a consumer still reads it")
            stage[s] = (tile, False, False, frozenset())
        elif kind == "read":
            _, part, tile = op
            s = tile % stages
            t, kp, vp, _ = stage.get(s, (None, False, False, frozenset()))
            if t != tile or not (kp if part == "K" else vp):
                raise Hazard(f"consumer {a - 1} reads {part} of tile {tile}: stage {s} holds {t}, published "
                             f"K {kp} V {vp}")
            reading.add((a, tile))
        elif kind == "release":
            tile = op[1]
            s = tile % stages
            t, kp, vp, rel = stage[s]
            if t != tile:
                raise Hazard(f"consumer {a - 1} releases tile {tile}: stage {s} holds {t}")
            stage[s] = (t, kp, vp, rel | {a})
            reading.discard((a, tile))
            name = f"empty{s}"
            pending, completed = mbar.get(name, (0, 0))
            pending += 1
            if pending == mb_count[name]:
                pending, completed = 0, completed + 1
            mbar[name] = (pending, completed)
        elif kind in ("arrive", "sync"):
            bid = op[1]
            members, gen = named.get(bid, ((), 0))
            members = members + ((a, kind),)
            if len(members) == 2:
                (a1, k1), (a2, k2) = members
                if a1 == a2:
                    raise Hazard(f"named barrier {bid} generation {gen} completed by warpgroup {a1 - 1} alone")
                if k1 == k2 == "arrive":
                    raise Hazard(f"named barrier {bid} generation {gen} completed by arrivals alone")
                named[bid] = ((), gen + 1)
            else:
                named[bid] = (members, gen)
                if kind == "sync":
                    waiting[a] = (bid, gen)
        if landing is None:
            pcs = tuple(p + (1 if i == a else 0) for i, p in enumerate(pcs))
        return (pcs, frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                frozenset(stage.items()), frozenset(reading), frozenset(landings))

    stack = [init]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        moved = False
        for a in range(3):
            nxt = step(state, a)
            if nxt is not None:
                moved = True
                stack.append(nxt)
        for landing in state[6]:
            moved = True
            stack.append(step(state, None, landing))
        if not moved:
            pcs, waiting, named, _, _, _, landings = state
            if any(pcs[a] < len(progs[a]) for a in range(3)) or waiting or landings:
                dead.append(state)
            elif any(members for members, _ in dict(named).values()):
                raise Hazard(f"named barrier generation left open at exit: {dict(named)}")
    return len(seen), dead


# ------------------------------------------------------------------------------------------------------------------
# The persistent variant of the library kernel (csrc/mla_prefill_wgmma.cu at 89103da; measured no faster than the
# one-item-per-CTA grid and not kept: benchmarks/NOTES.md "cuda prefill, round 2"; modelled here for the next attempt,
# e.g. with a second Q buffer), persistent: one CTA takes a list of work items; items with n = 0
# key tiles are written by the producer warp alone (no barrier operation). Per handed item the producer waits for
# both consumers' release of Q (emptyQ, count 2 here: one per warpgroup), writes the item slot and loads Q (fullQ by
# its landing), then the item's tiles into the ring continuing its global tile count g, and for a tail item waits
# for the last tile's V, zeroes its rows past the sequence and arrives on tailV[s]. After the last item it waits for
# emptyQ and arrives on fullQ with n = 0 (the end). Consumers: WG1 arrives at TURN0 once; per item fullQ (parity =
# items taken & 1), read the slot and Q, S(0), S(j) + P·V(j-1) turns with an arrival after every turn, Q released
# after the item's last S completes, the last tile's V behind tailV[s] (parity bit s toggled per use) or fullV;
# after the end item WG0 syncs TURN0 once (WG1's last arrival).


def programs_persistent(items, stages, mutant=None):
    """Producer's, WG0's, WG1's operations for a persistent CTA running ``items`` [(n tiles, tail tile?)]."""
    prod, g, handed = [], 0, 0
    for n, tail in items:
        if n == 0:
            continue
        if handed > 0 and mutant != "no_emptyQ_wait":
            prod.append(("mwait", "emptyQ", (handed - 1) & 1))
        prod.append(("fillQ", handed))
        prod.append(("land", (("marrive", "fullQ", ("Q", handed)),)))
        for i in range(n):
            gi, s = g + i, (g + i) % stages
            if gi >= stages:
                prod.append(("mwait", f"empty{s}", (gi // stages - 1) & 1))
            prod.append(("fill", gi))
            prod.append(("land", (("marrive", f"fullK{s}", ("K", gi)), ("marrive", f"fullV{s}", ("V", gi)))))
        if tail:
            gl = g + n - 1
            s = gl % stages
            prod += [("mwait", f"fullV{s}", (gl // stages) & 1), ("zero", gl), ("marrive", f"tailV{s}", ("T", gl))]
        g += n
        handed += 1
    if handed > 0:
        prod.append(("mwait", "emptyQ", (handed - 1) & 1))
    prod += [("fillQ", "end"), ("marrive", "fullQ", ("Q", "end"))]

    cons = []
    for w in (0, 1):
        mine, other = f"TURN{w}", f"TURN{1 - w}"
        c = [("arrive", "TURN0")] if w == 1 else []
        g, taken, tail_par = 0, 0, [0] * stages
        for n, tail in items:
            if n == 0:
                continue
            c += [("mwait", "fullQ", taken & 1), ("readQ", taken)]
            if mutant == "early_releaseQ":
                c.append(("releaseQ", taken))
            c += [("mwait", f"fullK{g % stages}", (g // stages) & 1), ("sync", mine), ("read", "K", g),
                  ("arrive", other)]
            if n == 1 and mutant != "early_releaseQ":
                c.append(("releaseQ", taken))
            for j in range(1, n):
                gj = g + j
                c += [("mwait", f"fullK{gj % stages}", (gj // stages) & 1),
                      ("mwait", f"fullV{(gj - 1) % stages}", ((gj - 1) // stages) & 1),
                      ("sync", mine), ("read", "K", gj), ("read", "V", gj - 1)]
                if not (mutant == "wg1_no_last_arrive" and w == 1 and gj == sum(k for k, _ in items) - 1):
                    c.append(("arrive", other))
                if j == n - 1 and mutant != "early_releaseQ":
                    c.append(("releaseQ", taken))
                c.append(("release", gj - 1))
            gl = g + n - 1
            s = gl % stages
            if tail and mutant != "tail_full_wait":
                c.append(("mwait", f"tailV{s}", tail_par[s]))
                if mutant != "tail_parity_kept":
                    tail_par[s] ^= 1
            else:
                c.append(("mwait", f"fullV{s}", (gl // stages) & 1))
            c += [("read", "V", gl), ("release", gl)]
            g += n
            taken += 1
        c += [("mwait", "fullQ", taken & 1), ("readQ", "end")]
        if w == 0 and mutant != "no_final_sync":
            c.append(("sync", "TURN0"))
        cons.append(c)
    return [prod] + cons


def explore_persistent(items, stages, mutant=None):
    """Every interleaving of the persistent protocol: (states visited, deadlocked states); raises Hazard."""
    progs = programs_persistent(items, stages, mutant)
    tails, g = set(), 0
    for n, tail in items:
        if tail and n:
            tails.add(g + n - 1)
        g += n
    counts = {f"empty{s}": 2 for s in range(stages)}
    counts.update(emptyQ=2)
    # state: pcs, waiting, named, mbar, stage {s: (tile, K landed, V landed, zeroed, released-by)}, reading
    # {(actor, tile, part)}, landings, qbuf (item, landed, released-by, readers)
    init = ((0, 0, 0), frozenset(), frozenset(), frozenset(), frozenset(), frozenset(), frozenset(),
            (None, False, frozenset((1, 2)), frozenset()))
    seen, dead = set(), []

    def count(mbar, name):
        pending, completed = mbar.get(name, (0, 0))
        pending += 1
        if pending == counts.get(name, 1):
            pending, completed = 0, completed + 1
        mbar[name] = (pending, completed)

    def step(state, a, landing=None):
        pcs, waiting, named, mbar, stage, reading, landings, qbuf = state
        waiting, named, mbar, stage = dict(waiting), dict(named), dict(mbar), dict(stage)
        reading, landings = set(reading), set(landings)
        if landing is not None:
            landings.discard(landing)
            op = landing
        elif a in waiting:
            bid, gen = waiting[a]
            if named.get(bid, ((), 0))[1] == gen:
                return None
            del waiting[a]
            return (pcs, frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                    frozenset(stage.items()), frozenset(reading), frozenset(landings), qbuf)
        elif pcs[a] >= len(progs[a]):
            return None
        else:
            op = progs[a][pcs[a]]
        kind = op[0]
        if kind == "mwait":
            _, name, parity = op
            if mbar.get(name, (0, 0))[1] & 1 == parity:
                return None
        elif kind == "marrive":
            _, name, (part, tile) = op
            if part == "Q":
                item, landed, rel, readers = qbuf
                if item != tile:
                    raise Hazard(f"fullQ completes item {tile} but Q holds {item}")
                qbuf = (item, True, rel, readers)
            else:
                s = tile % stages
                t, kl, vl, z, rel = stage.get(s, (None, False, False, False, frozenset()))
                if t != tile:
                    raise Hazard(f"{name}: tile {tile} but stage {s} holds {t}")
                stage[s] = (t, kl or part == "K", vl or part == "V", z or part == "T", rel)
            count(mbar, name)
        elif kind == "land":
            landings.update(op[1])
        elif kind == "fillQ":
            item, landed, rel, readers = qbuf
            if rel != frozenset((1, 2)) or readers:
                raise Hazard(f"Q / item slot rewritten for item {op[1]} while item {item} is still read "
                             f"(released by {sorted(rel)}, read by {sorted(readers)})")
            qbuf = (op[1], False, frozenset(), frozenset())
        elif kind == "readQ":
            item, landed, rel, readers = qbuf
            if item != op[1] or (item != "end" and not landed):
                raise Hazard(f"consumer {a - 1} reads item {op[1]}: Q holds {item}, landed {landed}")
            qbuf = (item, landed, rel | {a} if item == "end" else rel, readers | {a} if item != "end" else readers)
        elif kind == "releaseQ":
            item, landed, rel, readers = qbuf
            if item != op[1] or a not in readers:
                raise Hazard(f"consumer {a - 1} releases Q of item {op[1]}: Q holds {item}")
            qbuf = (item, landed, rel | {a}, readers - {a})
            count(mbar, "emptyQ")
        elif kind == "fill":
            tile = op[1]
            s = tile % stages
            if s in stage and stage[s][4] != frozenset((1, 2)):
                raise Hazard(f"stage {s} refilled with tile {tile} before both consumers released tile {stage[s][0]}")
            if any(t % stages == s for (_, t, _) in reading):
                raise Hazard(f"stage {s} refilled with tile {tile} while a consumer still reads it")
            stage[s] = (tile, False, False, False, frozenset())
        elif kind == "zero":
            tile = op[1]
            s = tile % stages
            t, kl, vl, z, rel = stage.get(s, (None, False, False, False, frozenset()))
            if t != tile or not vl:
                raise Hazard(f"producer zeroes V of tile {tile}: stage {s} holds {t}, V landed {vl}")
            if any(t2 == tile and part == "V" for (_, t2, part) in reading):
                raise Hazard(f"producer zeroes V of tile {tile} while a consumer reads it")
        elif kind == "read":
            _, part, tile = op
            s = tile % stages
            t, kl, vl, z, _ = stage.get(s, (None, False, False, False, frozenset()))
            if t != tile or not (kl if part == "K" else vl) or (part == "V" and tile in tails and not z):
                raise Hazard(f"consumer {a - 1} reads {part} of tile {tile}: stage {s} holds {t}, landed K {kl} "
                             f"V {vl}, zeroed {z}")
            if part == "K" and a not in qbuf[3]:  # S reads Q: only between readQ and releaseQ
                raise Hazard(f"consumer {a - 1} issues S of tile {tile} without Q")
            reading.add((a, tile, part))
        elif kind == "release":
            tile = op[1]
            s = tile % stages
            t, kl, vl, z, rel = stage[s]
            if t != tile:
                raise Hazard(f"consumer {a - 1} releases tile {tile}: stage {s} holds {t}")
            stage[s] = (t, kl, vl, z, rel | {a})
            reading -= {(a, tile, "K"), (a, tile, "V")}
            count(mbar, f"empty{s}")
        elif kind in ("arrive", "sync"):
            bid = op[1]
            members, gen = named.get(bid, ((), 0))
            members = members + ((a, kind),)
            if len(members) == 2:
                (a1, k1), (a2, k2) = members
                if a1 == a2:
                    raise Hazard(f"named barrier {bid} generation {gen} completed by warpgroup {a1 - 1} alone")
                if k1 == k2 == "arrive":
                    raise Hazard(f"named barrier {bid} generation {gen} completed by arrivals alone")
                named[bid] = ((), gen + 1)
            else:
                named[bid] = (members, gen)
                if kind == "sync":
                    waiting[a] = (bid, gen)
        if landing is None:
            pcs = tuple(p + (1 if i == a else 0) for i, p in enumerate(pcs))
        return (pcs, frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                frozenset(stage.items()), frozenset(reading), frozenset(landings), qbuf)

    stack = [init]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        moved = False
        for a in range(3):
            nxt = step(state, a)
            if nxt is not None:
                moved = True
                stack.append(nxt)
        for landing in state[6]:
            moved = True
            stack.append(step(state, None, landing))
        if not moved:
            pcs, waiting, named, _, _, _, landings, _ = state
            if any(pcs[a] < len(progs[a]) for a in range(3)) or waiting or landings:
                dead.append(state)
            elif any(members for members, _ in dict(named).values()):
                raise Hazard(f"named barrier generation left open at exit: {dict(named)}")
    return len(seen), dead


PERSISTENT_ITEMS = [
    [],                                      # no item with a key tile (the CTA only writes empty rows, or nothing)
    [(1, True)], [(1, False), (1, True)], [(2, True), (1, True)], [(1, True), (0, False), (2, False)],
    [(3, True), (2, True)], [(2, False), (2, True)], [(1, True), (1, True), (1, True)],
    [(4, True), (1, False)], [(1, False), (4, True)], [(2, True), (2, True), (1, True)],
    [(5, True)], [(3, False), (3, True)],
]


def main():
    ok = True
    print("protocol of k_prefill, every interleaving of producer / WG0 / WG1:")
    for pingpong, tma in ((True, False), (False, False), (True, True)):
        for stages in (2, 3, 4) if tma else (3, 4, 5):
            for n in range(1, 9):
                tag = f"{'TMA      ' if tma else 'ping-pong' if pingpong else 'NOPP     '}, stages {stages}, {n} tiles"
                try:
                    states, dead = explore(n, stages, pingpong=pingpong, tma=tma)
                except Hazard as e:
                    print(f"  {tag}: HAZARD {e}")
                    ok = False
                    continue
                print(f"  {tag}: {states:7d} states, {'no deadlock' if not dead else f'{len(dead)} DEADLOCKED states'}")
                ok &= not dead
    print("broken variants (each must be caught):")
    for mutant, stages, n, tma in (("stages_2", 2, 4, False), ("no_empty_wait", 4, 6, False),
                                   ("early_release", 3, 5, False), ("extra_arrive", 4, 3, False),
                                   ("no_initial_arrive", 4, 2, False), ("wrong_parity", 3, 4, False),
                                   ("no_empty_wait", 2, 4, True), ("early_release", 2, 3, True),
                                   ("wrong_parity", 2, 4, True)):
        try:
            _, dead = explore(n, stages, None if mutant == "stages_2" else mutant, tma=tma)
            caught = bool(dead)
            why = f"{len(dead)} deadlocked states" if dead else "NOT CAUGHT"
        except Hazard as e:
            caught, why = True, f"hazard: {e}"
        print(f"  {mutant:18s} ({'TMA, ' if tma else ''}stages {stages}, {n} tiles): {why}")
        ok &= caught
    print("persistent variant (89103da), every interleaving of producer / WG0 / WG1 / TMA landings over item lists:")
    for stages in (2, 3, 4):
        for items in PERSISTENT_ITEMS:
            tag = f"stages {stages}, items {items}"
            try:
                states, dead = explore_persistent(items, stages)
            except Hazard as e:
                print(f"  {tag}: HAZARD {e}")
                ok = False
                continue
            print(f"  {tag}: {states:7d} states, {'no deadlock' if not dead else f'{len(dead)} DEADLOCKED states'}")
            ok &= not dead
    print("broken persistent variants (each must be caught):")
    for mutant, stages, items in (("no_emptyQ_wait", 4, [(1, False), (2, True)]),
                                  ("early_releaseQ", 4, [(2, True), (1, True)]),
                                  ("no_final_sync", 3, [(1, True)]),
                                  ("tail_full_wait", 3, [(2, True)]),
                                  ("tail_parity_kept", 2, [(2, True), (2, True)]),
                                  ("wg1_no_last_arrive", 3, [(2, False), (2, True)])):
        try:
            _, dead = explore_persistent(items, stages, mutant)
            caught = bool(dead)
            why = f"{len(dead)} deadlocked states" if dead else "NOT CAUGHT"
        except Hazard as e:
            caught, why = True, f"hazard: {e}"
        print(f"  {mutant:18s} (stages {stages}, items {items}): {why}")
        ok &= caught
    print("ALL PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
