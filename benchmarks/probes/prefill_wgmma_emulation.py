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
Broken variants of the protocol must be caught (a check that a mistake would show). (The persistent variant of
round 2 and its model were not kept: both are in git at 89103da / 3c974bf^, benchmarks/NOTES.md "cuda prefill, round 2".)

The persistent kernel (csrc/mla_prefill_persistent.cu, round n) as part PERSISTENT: the producer claims items (a list
of tile counts, 0 = an item without a visible key, then the end marker), each through Q slot k % 2 (emptyQ wait from
the third item on, Q's landing or a plain arrival completing fullQ), the tiles into the ring by a global tile index,
and for an item whose last tile has keys past its sequence's end the zeroing of that tile's V rows after its fullV
(one tailV barrier per stage). The consumers read each item's Q from its first S to its emptyQ release, carry the
ring's stage and parity across items and one tailV parity bit per stage; WG1 arrives at TURN0 once before its first
item and after every turn, WG0 syncs TURN0 once more at the end. Also checked: no Q slot refilled before both
consumers released it or while one reads it, no Q read (each S) from a slot without the item's landed Q, no tail
tile's V read before its zeroing, no zeroing of a tile the stage does not hold or before its V landed.

    python3 benchmarks/probes/prefill_wgmma_emulation.py [--persistent]    # --persistent: that part alone
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


def persistent_programs(items, tails, stages, mutant=None):
    """The persistent kernel's producer, WG0 and WG1 for the item list `items` (tile counts) whose indices in `tails`
    end on a tail tile; returns (programs, the global indices of the tail tiles)."""
    prod, g, tail_tiles = [], 0, set()
    for k, n in enumerate(list(items) + [None]):
        slot = k % 2
        if k >= 2 and mutant != "no_emptyq_wait":
            prod.append(("mwait", f"emptyQ{slot}", (k // 2 - 1) & 1))
        if n is None:  # the end marker: no Q
            prod.append(("qfill", k, slot))
            prod.append(("marrive", f"fullQ{slot}", ("Q", k)))
            break
        prod.append(("qfill", k, slot))
        if n > 0:
            prod.append(("land", (("marrive", f"fullQ{slot}", ("Q", k)),)))
        else:
            prod.append(("marrive", f"fullQ{slot}", ("Q", k)))
        for _ in range(n):
            s = g % stages
            if g >= stages:
                prod.append(("mwait", f"empty{s}", (g // stages - 1) & 1))
            prod.append(("fill", g))
            prod.append(("land", (("marrive", f"fullK{s}", ("K", g)), ("marrive", f"fullV{s}", ("V", g)))))
            g += 1
        if n > 0 and k in tails:
            s = (g - 1) % stages
            tail_tiles.add(g - 1)
            prod.append(("mwait", f"fullV{s}", ((g - 1) // stages) & 1))
            prod.append(("zero", g - 1))
            prod.append(("marrive", f"tailV{0 if mutant == 'one_tailv' else s}", None))
    cons = []
    for w in (0, 1):
        mine, other = f"TURN{w}", f"TURN{1 - w}"
        c, g, tail_par = [], 0, [0] * stages
        if w == 1:
            c.append(("arrive", "TURN0"))
        for k, n in enumerate(list(items) + [None]):
            slot = k % 2
            c.append(("mwait", f"fullQ{slot}", (k // 2) & 1))
            if n is None:
                break
            if n == 0:
                c.append(("releaseq", k, slot))
                continue
            c += [("mwait", f"fullK{g % stages}", (g // stages) & 1), ("sync", mine), ("readq", k, slot)]
            if mutant == "early_q_release":
                c.append(("releaseq", k, slot))
            c.append(("read", "K", g))
            if w == 0 or mutant != "skip_last_arrive" or n > 1:
                c.append(("arrive", other))
            for j in range(g + 1, g + n):
                c += [("mwait", f"fullK{j % stages}", (j // stages) & 1),
                      ("mwait", f"fullV{(j - 1) % stages}", ((j - 1) // stages) & 1),
                      ("sync", mine), ("readq", k, slot), ("read", "K", j), ("read", "V", j - 1)]
                if w == 0 or mutant != "skip_last_arrive" or j < g + n - 1:
                    c.append(("arrive", other))
                c.append(("release", j - 1))
            last = g + n - 1
            s = last % stages
            if k in tails:
                b = 0 if mutant == "one_tailv" else s
                c.append(("mwait", f"tailV{b}", tail_par[b]))
                tail_par[b] ^= 1
            else:
                c.append(("mwait", f"fullV{s}", (last // stages) & 1))
            c += [("read", "V", last), ("release", last)]
            if mutant != "early_q_release":
                c.append(("releaseq", k, slot))
            g += n
        if w == 0 and mutant != "no_final_sync":
            c.append(("sync", "TURN0"))
        cons.append(c)
    return [prod] + cons, frozenset(tail_tiles)


class Hazard(Exception):
    """A stage used out of order, or a named barrier generation completed wrongly."""


def explore(n, stages, mutant=None, pingpong=True, tma=False, persistent=None):
    """Every interleaving for n tiles (persistent: (items, tails) of the persistent kernel instead): returns (states
    visited, deadlocked states); raises Hazard."""
    tail_tiles = frozenset()
    if persistent is None:
        progs = programs(n, stages, mutant, pingpong, tma)
    else:
        progs, tail_tiles = persistent_programs(*persistent, stages, mutant)
    # the two consumer warpgroups (empty*, emptyQ*); full*, tailV*: 1 (the producer, its warp as one actor)
    mb_count = {**{f"empty{s}": 2 for s in range(stages)}, "emptyQ0": 2, "emptyQ1": 2}
    # state: pcs, waiting {actor: (id, gen)}, named {id: (members, gen)}, mbar {name: (pending, completed)},
    # stage {s: (tile, K published, V published, released-by)}, reading {(actor, tile)}, landings {pending
    # TMA barrier completions}, qslot {slot: (item, landed, released-by)}, zeroed {tail tiles zeroed}; actor 3 is
    # the copy engine
    init = ((0, 0, 0), frozenset(), frozenset(), frozenset(), frozenset(), frozenset(), frozenset(), frozenset(),
            frozenset())
    seen, dead = set(), []

    def step(state, a, landing=None):
        pcs, waiting, named, mbar, stage, reading, landings, qslot, zeroed = state
        waiting, named, mbar, stage, qslot = dict(waiting), dict(named), dict(mbar), dict(stage), dict(qslot)
        reading, landings, zeroed = set(reading), set(landings), set(zeroed)

        def pack():
            return (pcs, frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                    frozenset(stage.items()), frozenset(reading), frozenset(landings), frozenset(qslot.items()),
                    frozenset(zeroed))
        if landing is not None:  # the copy engine: one pending copy lands, its barrier phase completes
            landings.discard(landing)
            op = landing
        elif a in waiting:  # blocked in bar.sync until its generation completes
            bid, gen = waiting[a]
            if named.get(bid, ((), 0))[1] == gen:
                return None
            del waiting[a]
            return pack()
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
            if what is not None and what[0] == "Q":  # Q slot's item (and its Q, if any) published
                k = what[1]
                item, _, rel = qslot.get(k % 2, (None, False, frozenset()))
                if item != k:
                    raise Hazard(f"{name}: publishes item {k} but its Q slot holds {item}")
                qslot[k % 2] = (item, True, rel)
            elif what is not None:  # publish K or V of a tile: the stage must hold it
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
            if any(len(r) == 2 and r[1] % stages == s for r in reading):
                raise Hazard(f"stage {s} refilled with tile {tile} while a consumer still reads it")
            stage[s] = (tile, False, False, frozenset())
        elif kind == "read":
            _, part, tile = op
            s = tile % stages
            t, kp, vp, _ = stage.get(s, (None, False, False, frozenset()))
            if t != tile or not (kp if part == "K" else vp):
                raise Hazard(f"consumer {a - 1} reads {part} of tile {tile}: stage {s} holds {t}, published "
                             f"K {kp} V {vp}")
            if part == "V" and tile in tail_tiles and tile not in zeroed:
                raise Hazard(f"consumer {a - 1} reads V of tail tile {tile} before its rows were zeroed")
            reading.add((a, tile))
        elif kind == "zero":
            tile = op[1]
            s = tile % stages
            t, _, vp, _ = stage.get(s, (None, False, False, frozenset()))
            if t != tile or not vp:
                raise Hazard(f"producer zeroes V of tile {tile}: stage {s} holds {t}, V landed {vp}")
            zeroed.add(tile)
        elif kind == "qfill":
            _, k, slot = op
            if slot in qslot and qslot[slot][2] != frozenset((1, 2)):
                raise Hazard(f"Q slot {slot} refilled with item {k} before both consumers released item "
                             f"{qslot[slot][0]}")
            if any(r[1] == "Q" and r[2] == slot for r in reading if len(r) == 3):
                raise Hazard(f"Q slot {slot} refilled with item {k} while a consumer still reads it")
            qslot[slot] = (k, False, frozenset())
        elif kind == "readq":
            _, k, slot = op
            item, landed, _ = qslot.get(slot, (None, False, frozenset()))
            if item != k or not landed:
                raise Hazard(f"consumer {a - 1} reads Q of item {k}: slot {slot} holds {item}, landed {landed}")
            reading.add((a, "Q", slot))
        elif kind == "releaseq":
            _, k, slot = op
            item, landed, rel = qslot[slot]
            if item != k:
                raise Hazard(f"consumer {a - 1} releases item {k}: Q slot {slot} holds {item}")
            qslot[slot] = (item, landed, rel | {a})
            reading.discard((a, "Q", slot))
            name = f"emptyQ{slot}"
            pending, completed = mbar.get(name, (0, 0))
            pending += 1
            if pending == mb_count[name]:
                pending, completed = 0, completed + 1
            mbar[name] = (pending, completed)
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
        return pack()

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
            pcs, waiting, named, _, _, _, landings, _, _ = state
            if any(pcs[a] < len(progs[a]) for a in range(3)) or waiting or landings:
                dead.append(state)
            elif any(members for members, _ in dict(named).values()):
                raise Hazard(f"named barrier generation left open at exit: {dict(named)}")
    return len(seen), dead


PERSISTENT_CASES = tuple((items, frozenset(tails)) for items, tails in (
    ((), ()), ((0,), ()), ((1,), ()), ((1,), (0,)), ((2,), (0,)), ((1, 1), ()), ((1, 1), (0, 1)), ((2, 1), (1,)),
    ((1, 2), (0,)), ((0, 1, 0), ()), ((1, 0, 2), (2,)), ((3, 1), (0, 1)), ((1, 1, 1), (0, 1, 2)),
    ((2, 2), (0,)), ((1, 2, 1), (0, 2)), ((1, 1, 1, 1), (1, 3))))
"""The persistent part's item lists (tile counts) and which of them end on a tail tile: 0-4 items, empty items among
them, more items than Q slots, tail tiles in consecutive items (so in every stage at 2 and 3 stages)."""


def main(only_persistent=False):
    ok = True
    if not only_persistent:  # the one-CTA-an-item kernels
        print("protocol of k_prefill, every interleaving of producer / WG0 / WG1:")
        for pingpong, tma in ((True, False), (False, False), (True, True)):
            for stages in (2, 3, 4) if tma else (3, 4, 5):
                for n in range(1, 9):
                    kind = 'TMA      ' if tma else 'ping-pong' if pingpong else 'NOPP     '
                    tag = f"{kind}, stages {stages}, {n} tiles"
                    try:
                        states, dead = explore(n, stages, pingpong=pingpong, tma=tma)
                    except Hazard as e:
                        print(f"  {tag}: HAZARD {e}")
                        ok = False
                        continue
                    verdict = 'no deadlock' if not dead else f'{len(dead)} DEADLOCKED states'
                    print(f"  {tag}: {states:7d} states, {verdict}")
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
    print("persistent kernel (mla_prefill_persistent.cu), item lists (tile counts; * = ends on a tail tile):")
    for items, tails in PERSISTENT_CASES:
        for stages in (2, 3):
            listed = ' '.join(f"{n}{'*' if k in tails else ' '}" for k, n in enumerate(items))
            tag = f"stages {stages}, items {listed}"
            try:
                states, dead = explore(0, stages, persistent=(items, tails))
            except Hazard as e:
                print(f"  {tag}: HAZARD {e}")
                ok = False
                continue
            print(f"  {tag}: {states:7d} states, {'no deadlock' if not dead else f'{len(dead)} DEADLOCKED states'}")
            ok &= not dead
    print("broken variants of the persistent kernel (each must be caught):")
    for mutant, items, tails in (("no_emptyq_wait", (1, 1, 1), ()), ("early_q_release", (2, 1, 1), ()),
                                 ("skip_last_arrive", (2, 1), ()), ("no_final_sync", (1, 1), ()),
                                 ("one_tailv", (1, 1, 2), (0, 1))):
        try:
            _, dead = explore(0, 3, mutant, persistent=(items, frozenset(tails)))
            caught = bool(dead)
            why = f"{len(dead)} deadlocked states" if dead else "NOT CAUGHT"
        except Hazard as e:
            caught, why = True, f"hazard: {e}"
        print(f"  {mutant:18s} (stages 3, items {items}, tails {tails}): {why}")
        ok &= caught
    print("ALL PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(only_persistent="--persistent" in sys.argv[1:]))
