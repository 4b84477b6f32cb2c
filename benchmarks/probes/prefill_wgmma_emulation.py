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
    print("ALL PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
