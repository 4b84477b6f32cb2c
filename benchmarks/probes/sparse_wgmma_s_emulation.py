"""CPU check of the sparse probe's variant S protocol (k_sparse_s in sparse_wgmma_probe.cu), no GPU needed.

Variant S = the decode seesaw (decode_wgmma_probe_z.cu's variant Z, whose consumer programs this file imports
from decode_wgmma_z_emulation.py unchanged) fed by a producer that gathers a tile's E4M3 codes into the upper
half of the freed bf16 stage and converts them there in place. The producer is modeled as two actors (each one
half of the 128 producer threads), so the in-place conversion's cross-thread hazards are visible:

  per tile i (stage s = i % 2): [i >= 2: wait empty[s] parity ((i - 2) / 2) & 1]; gather (cp.async into the
  code blocks); landed (own copies complete); PROD; read/convert/store blocks 0-3 -> slabs 0-3; read block 4;
  PROD; store slab 4; read/store 5, 6; read blocks 7, 8; PROD; store slabs 7, 8; arrive full[s].

Buffers are byte ranges of the kernel's layout: slab j = [8192 j, 8192 j + 8192) of the stage, code block k =
[36864 + 4096 k, +4096). Checked over every interleaving (depth-first, states memoized) for 1..6 tiles:
no deadlock; no code block read before every producer actor's copies landed; no slab stored while any producer
actor has not yet read a code block the slab overlaps (conservative: any overlap of the ranges); a stage
gathered into only after both consumer warpgroups released its previous tile, and never while a producer actor
still converts that tile; a consumer reading a stage (S at the start of its step, its last P.V at the end)
only while it holds its tile fully converted (every slab stored by both producer actors); the consumers'
P-slab / row-maximum buffers and named barriers as in the Z model (no generation completed by arrivals
alone, none left open at exit). Broken variants of the protocol must be caught.

    python3 benchmarks/probes/sparse_wgmma_s_emulation.py     # about a minute
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_wgmma_z_emulation as z  # noqa: E402  (the seesaw consumers' programs)

SLAB, CODE_OFF, BLOCK = 8192, 36864, 4096
PRODUCERS = 2  # producer actors (halves of the producer warpgroup)


def overlaps(j, k):
    """Slab j's bytes meet code block k's (both in one stage)."""
    s0, s1 = SLAB * j, SLAB * (j + 1)
    b0, b1 = CODE_OFF + BLOCK * k, CODE_OFF + BLOCK * (k + 1)
    return s0 < b1 and b0 < s1


def producer_program(T):
    ops = []
    for i in range(T):
        s = i & 1
        if i >= 2:
            ops.append(("mwait", f"empty{s}", ((i - 2) >> 1) & 1))
        ops += [("gather", i), ("landed", i), ("sync", "PROD")]
        for k in range(4):
            ops += [("cread", i, k), ("cwrite", i, k)]
        ops += [("cread", i, 4), ("sync", "PROD"), ("cwrite", i, 4)]
        for k in (5, 6):
            ops += [("cread", i, k), ("cwrite", i, k)]
        ops += [("cread", i, 7), ("cread", i, 8), ("sync", "PROD"), ("cwrite", i, 7), ("cwrite", i, 8),
                ("marrive", f"full{s}_0")]
    return ops


def consumer_programs(T):
    """Z's WG0 / WG1 programs (one full barrier per stage), with the stage's last read (the warpgroup's last
    P.V) marked just before its release."""
    z.GROUPS[0] = 1
    _, w0, w1 = z.programs(T)
    out = []
    for w in (w0, w1):
        prog = []
        for op in w:
            if op[0] == "release":
                prog.append(("stage_use", op[1][1]))
            prog.append(op)
        out.append(prog)
    return out


def programs(T):
    """Actors 0..PRODUCERS-1: producer halves; then WG0, WG1."""
    return [producer_program(T) for _ in range(PRODUCERS)] + consumer_programs(T)


MB_COUNT = {"empty0": 2, "empty1": 2, "full0_0": PRODUCERS, "full1_0": PRODUCERS}
BARRIER_ACTORS = {"PROD": PRODUCERS}  # every other named barrier: the two consumer warpgroups


class Hazard(Exception):
    """A buffer used out of order, or a named barrier completed by one side alone."""


def check_protocol(T, make_programs=None):
    progs = (make_programs or programs)(T)
    n = len(progs)
    wg_of = {PRODUCERS: 0, PRODUCERS + 1: 1}
    init = (tuple([0] * n), frozenset(), frozenset(), frozenset(), frozenset(), frozenset())
    seen, deadlocks, finals = set(), [], 0
    stack = [init]

    def unpack(st):
        pcs, waiting, named, mbar, bufs, stage = st
        return list(pcs), dict(waiting), dict(named), dict(mbar), dict(bufs), dict(stage)

    def pack(pcs, waiting, named, mbar, bufs, stage):
        return (tuple(pcs), frozenset(waiting.items()), frozenset(named.items()), frozenset(mbar.items()),
                frozenset(bufs.items()), frozenset(stage.items()))

    # stage[s] = (tile, released by consumer warpgroups, producers landed, (actor, block) read, (actor, slab) stored)
    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        pcs, waiting, named, mbar, bufs, stage = unpack(st)
        if all(pcs[a] == len(progs[a]) for a in range(n)) and not waiting:
            finals += 1
            if any(c for c, _ in named.values()):
                raise Hazard(f"T={T}: barrier left open at exit: {named}")
            continue
        moved = False
        for a in range(n):
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
            if kind == "mwait":
                _, phase = mbar2.get(op[1], (0, 0))
                if (phase & 1) == op[2]:
                    continue
            elif kind == "marrive":
                pending, phase = mbar2.get(op[1], (0, 0))
                pending += 1
                if pending == MB_COUNT[op[1]]:
                    pending, phase = 0, phase + 1
                mbar2[op[1]] = (pending, phase)
            elif kind in ("arrive", "sync"):
                need = BARRIER_ACTORS.get(op[1], 2)
                count, gen = named2.get(op[1], (0, 0))
                if count + 1 == need:
                    if kind == "arrive" and not any(w[0] == op[1] for w in waiting2.values()):
                        raise Hazard(f"T={T}: barrier {op[1]} completed by arrivals alone (actor {a})")
                    named2[op[1]] = (0, gen + 1)
                else:
                    named2[op[1]] = (count + 1, gen)
                    if kind == "sync":
                        waiting2[a] = (op[1], gen)
                        stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2, stage2))
                        moved = True
                        continue
            elif kind == "gather":
                i = op[1]
                s = i & 1
                tile, rel, landed, reads, writes = stage2.get(s, (None, frozenset(), frozenset(), frozenset(),
                                                                  frozenset()))
                if tile != i:
                    if tile is not None and rel != frozenset({0, 1}):
                        raise Hazard(f"T={T}: stage {s} gathered into for tile {i} before tile {tile} was released")
                    if tile is not None and len(writes) != PRODUCERS * 9:
                        raise Hazard(f"T={T}: stage {s} gathered into for tile {i} while tile {tile} converts")
                    stage2[s] = (i, frozenset(), frozenset(), frozenset(), frozenset())
            elif kind == "landed":
                i = op[1]
                tile, rel, landed, reads, writes = stage2[i & 1]
                if tile != i:
                    raise Hazard(f"T={T}: actor {a}'s copies of tile {i} land in a stage holding tile {tile}")
                stage2[i & 1] = (tile, rel, landed | {a}, reads, writes)
            elif kind == "cread":
                i, k = op[1], op[2]
                tile, rel, landed, reads, writes = stage2[i & 1]
                if tile != i:
                    raise Hazard(f"T={T}: actor {a} reads block {k} of tile {i} from a stage holding tile {tile}")
                if len(landed) != PRODUCERS:
                    raise Hazard(f"T={T}: actor {a} reads block {k} of tile {i} before every producer's copies landed")
                if any(overlaps(j, k) for _, j in writes):
                    raise Hazard(f"T={T}: actor {a} reads block {k} of tile {i} after a slab store overwrote it")
                stage2[i & 1] = (tile, rel, landed, reads | {(a, k)}, writes)
            elif kind == "cwrite":
                i, j = op[1], op[2]
                tile, rel, landed, reads, writes = stage2[i & 1]
                if tile != i:
                    raise Hazard(f"T={T}: actor {a} stores slab {j} of tile {i} into a stage holding tile {tile}")
                for k in range(9):
                    if overlaps(j, k) and any((b, k) not in reads for b in range(PRODUCERS)):
                        raise Hazard(f"T={T}: actor {a} stores slab {j} of tile {i} before every producer read "
                                     f"code block {k}")
                stage2[i & 1] = (tile, rel, landed, reads, writes | {(a, j)})
            elif kind == "stage_use":
                i = op[1]
                tile, rel, landed, reads, writes = stage2.get(i & 1, (None, None, None, None, frozenset()))
                if tile != i or len(writes) != PRODUCERS * 9:
                    raise Hazard(f"T={T}: warpgroup {wg_of[a]} reads stage {i & 1} for tile {i}: it holds tile {tile}, "
                                 f"{len(writes)} of {PRODUCERS * 9} slab parts converted")
            elif kind == "release":
                w, i = op[1]
                tile, rel, landed, reads, writes = stage2[i & 1]
                if tile != i:
                    raise Hazard(f"T={T}: warpgroup {w} releases tile {i} from a stage holding tile {tile}")
                stage2[i & 1] = (tile, rel | {w}, landed, reads, writes)
            elif kind == "write":
                val, consumed = bufs2.get(op[1], (None, True))
                if not consumed:
                    raise Hazard(f"T={T}: {op[1]} overwritten with tile {op[2]} before tile {val} was read")
                bufs2[op[1]] = (op[2], False)
            elif kind in ("read", "read_begin"):
                val, _ = bufs2.get(op[1], (None, True))
                if val != op[2]:
                    raise Hazard(f"T={T}: {op[1]} read for tile {op[2]} holds {val}")
                if kind == "read":
                    bufs2[op[1]] = (val, True)
            elif kind == "read_end":
                val, _ = bufs2[op[1]]
                bufs2[op[1]] = (val, True)
            else:
                raise AssertionError(f"unknown op {op}")
            pcs2[a] += 1
            stack.append(pack(pcs2, waiting2, named2, mbar2, bufs2, stage2))
            moved = True
        if not moved:
            deadlocks.append((pcs, {a: progs[a][pcs[a]] for a in range(n) if pcs[a] < len(progs[a])}))
    return len(seen), finals, deadlocks


# ------------------------------------------------------------------------------------------------------------
# Broken variants: each edits the correct programs; every one must be caught (a hazard, a deadlock, or a barrier
# left open) for some T <= 4.


def _edit_producers(fn):
    def make(T):
        progs = programs(T)
        for a in range(PRODUCERS):
            progs[a] = fn(progs[a], T)
        return progs
    return make


def _drop_nth_prod_sync(n_in_tile):
    def fn(ops, T):
        out, seen = [], {}
        for op in ops:
            if op == ("sync", "PROD"):
                tile = sum(1 for o in out if o[0] == "gather") - 1
                seen[tile] = seen.get(tile, 0) + 1
                if seen[tile] == n_in_tile:
                    continue
            out.append(op)
        return out
    return fn


def _late_read_8(ops, T):  # block 8 read after the last PROD barrier (slab 8 overlaps it)
    out = []
    for op in ops:
        if op[0] == "cread" and op[2] == 8:
            continue
        if op[0] == "cwrite" and op[2] == 7:
            out += [op, ("cread", op[1], 8)]
            continue
        out.append(op)
    return out


def _no_empty_wait(ops, T):
    return [op for op in ops if op[0] != "mwait"]


def _early_full(ops, T):  # full arrived at right after the copies landed (the consumers get codes, not bf16)
    out = []
    for op in ops:
        if op[0] == "marrive":
            continue
        out.append(op)
        if op[0] == "landed":
            out.append(("marrive", f"full{op[1] & 1}_0"))
    return out


def _early_release(T):  # consumers release the stage right after S, before their P.V products read V
    progs = programs(T)
    for a in (PRODUCERS, PRODUCERS + 1):
        out, started = [], set()
        for op in progs[a]:
            if op[0] == "release" or (op[0] == "marrive" and op[1].startswith("empty")):
                continue
            out.append(op)
            if op[0] == "stage_use" and op[1] not in started:  # the step's first read of the stage (S)
                started.add(op[1])
                out += [("release", (a - PRODUCERS, op[1])), ("marrive", f"empty{op[1] & 1}")]
        progs[a] = out
    return progs


MUTANTS = [
    ("no PROD barrier after the copies landed", _edit_producers(_drop_nth_prod_sync(1))),
    ("no PROD barrier before slab 4", _edit_producers(_drop_nth_prod_sync(2))),
    ("no PROD barrier before slabs 7-8", _edit_producers(_drop_nth_prod_sync(3))),
    ("block 8 read after the last PROD barrier", _edit_producers(_late_read_8)),
    ("producer does not wait for empty", _edit_producers(_no_empty_wait)),
    ("full arrived before the conversion", _edit_producers(_early_full)),
    ("consumers release the stage before P.V", _early_release),
]


def check_mutants():
    caught = 0
    for name, make in MUTANTS:
        found = None
        for T in range(1, 5):
            try:
                _, _, dl = check_protocol(T, make)
                if dl:
                    found = f"deadlock at T={T}: {dl[0][1]}"
            except (Hazard, AssertionError) as e:
                found = str(e)
            if found:
                break
        print(f"  mutant '{name}': {'caught: ' + found if found else 'NOT caught'}")
        caught += bool(found)
    return caught


# ------------------------------------------------------------------------------------------------------------
# Layout: the kernel's per-thread addresses, byte for byte (k_sparse_s's producer). Gather: warp pw, lane l,
# q = l % 4, rows 16 pw + l / 4 and + 8, chunk 4k + q of each row to code + 4096 k + 64 row + 16 q. Conversion:
# thread u, rows u / 4 and u / 4 + 32, chunk q = u % 4 of block k, its 16 bf16 to slab k, row bytes 32 q.. at
# 16-byte positions 2q, 2q + 1 swizzled by row % 8. Phases between the PROD barriers: 1 = rounds 0-3 and block
# 4's read, 2 = slab 4's store, rounds 5-6, blocks 7-8's reads, 3 = slabs 7-8's stores. Checked: no byte stored in
# a phase is read (by any thread) in that phase or a later one, every read finds the code it expects, and the
# stage ends as the bf16 tile in the slab layout the consumers' descriptors read (B's convert_tile layout).


def slab_off(row, byte, rows=64):
    return (byte >> 7) * rows * 128 + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def check_layout():
    stage = [None] * (9 * SLAB)
    for pw in range(4):
        for lane in range(32):
            q, gr = lane & 3, 16 * pw + (lane >> 2)
            for k in range(9):
                for row in (gr, gr + 8):
                    for b in range(16):
                        stage[CODE_OFF + BLOCK * k + 64 * row + 16 * q + b] = ("code", row, 16 * (4 * k + q) + b)
    reads = {1: set(), 2: set(), 3: set()}
    writes = {1: [], 2: [], 3: []}  # (address, value)
    errors = []
    phase_of_read = {k: 1 for k in range(5)} | {5: 2, 6: 2, 7: 2, 8: 2}
    phase_of_write = {k: 1 for k in range(4)} | {4: 2, 5: 2, 6: 2, 7: 3, 8: 3}
    for u in range(128):
        cr, q = u >> 2, u & 3
        for k in range(9):
            for row in (cr, cr + 32):
                src = CODE_OFF + BLOCK * k + 64 * row + 16 * q
                for b in range(16):
                    reads[phase_of_read[k]].add(src + b)
                    want = ("code", row, 16 * (4 * k + q) + b)
                    if stage[src + b] != want:
                        errors.append(f"thread {u} block {k} row {row}: {stage[src + b]} != {want}")
                d = SLAB * k + 128 * row
                for e in range(16):  # code e of the chunk -> bf16 element e: bytes 2e, 2e + 1 of the 32
                    pos = (2 * q + (e >> 3)) ^ (row & 7)
                    col = 16 * (4 * k + q) + e
                    for h in range(2):
                        writes[phase_of_write[k]].append((d + 16 * pos + 2 * (e & 7) + h, ("bf16", row, col, h)))
    for p in (1, 2, 3):
        w = {a for a, _ in writes[p]}
        for r in range(p, 4):
            if w & reads[r]:
                errors.append(f"phase {p} stores {len(w & reads[r])} bytes that phase {r} reads")
    addrs = [a for p in (1, 2, 3) for a, _ in writes[p]]
    if len(addrs) != len(set(addrs)) or len(addrs) != 9 * SLAB:
        errors.append(f"{len(addrs)} stores to {len(set(addrs))} addresses, want {9 * SLAB} once each")
    for p in (1, 2, 3):
        for a, v in writes[p]:
            stage[a] = v
    for row in range(64):
        for col in range(576):
            for h in range(2):
                a = slab_off(row, 2 * col + h)
                if stage[a] != ("bf16", row, col, h):
                    errors.append(f"row {row} col {col}: byte {a} holds {stage[a]}")
                    break
    return errors


def main() -> int:
    bad = 0
    errors = check_layout()
    print(f"layout (the kernel's per-thread addresses, byte for byte): "
          f"{'OK' if not errors else 'FAIL: ' + '; '.join(errors[:5])}")
    bad += bool(errors)
    print(f"overlaps (slab j: code blocks it covers): "
          f"{ {j: [k for k in range(9) if overlaps(j, k)] for j in range(9)} }")
    print(f"protocol of variant S ({PRODUCERS} producer actors + WG0 + WG1, every interleaving):")
    for T in range(1, 7):
        try:
            n, finals, dl = check_protocol(T)
        except (Hazard, AssertionError) as e:
            print(f"  T={T}: HAZARD {e}")
            bad += 1
            continue
        print(f"  T={T}: {n} states, {finals} final, {len(dl)} deadlocked")
        bad += bool(dl) + (finals == 0)
    print("broken variants (must all be caught):")
    bad += check_mutants() != len(MUTANTS)
    print("ALL PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
