"""CPU check of the cuda sparse decode's "earlier stage release" (branch wip/sparse-early-release), both row layouts
(576-byte rows: sparse_decode_kernel<false>; fp8_ds_mla's 656-byte rows: <true>), no GPU needed.

The protocol (csrc/mla_sparse_wgmma.cu): each consumer warpgroup releases a stage on its own mbarrier, empty[s]
(warpgroup 0's 4 warps) and empty[2 + s] (warpgroup 1's). Warpgroup 0 releases after its last P.V, which follows
H1F, which warpgroup 1 arrives at only after its S (and its flag reads) completed: from then on nobody reads slabs
0-3 (warpgroup 0's V), slab 8 (S's RoPE columns) or the flags of that stage. So the producer, per tile i >= 2 in
stage s = i % 2:
  wait empty[s] (WG0's release of tile i - 2) -> cp.async the tile's codes into slabs 0-3 (+ slab 8's rows 0-31 for
  the 576 layout's ninth block) and write its flags; wait empty[2 + s] (WG1's release) -> [fp8_ds_mla: cp.async the
  RoPE values into slab 8 and the scales into the stage's array: warpgroup 1 reads its float32 P1 from slab 8 and the
  scales until its last product]; the codes landed, PROD; convert in place; [fp8_ds_mla: the RoPE / scales landed];
  fence.proxy.async, arrive full[s].
Code block k (4 chunks of every row, 4,096 B = rows 32h..32h+31 of one slab's bytes, "slot") sits at
code_slot(k) = slab (k + 4) % 8 / 2, half (k + 4) % 2 for k < 8 (blocks 4-7 in slabs 0-1, 0-1 in slab 2, 2-3 in
slab 3) and slab 8's first half for block 8. The conversion (thread u: rows u/4, u/4 + 32, chunk u % 4):
  round 0: blocks 4-7 -> slabs 4-7 (free: no code there); load blocks 0, 1;   PROD
  round 1: store slabs 0, 1 (their slots held blocks 4-7, read by all); block 2 -> slab 2 (held blocks 0-1, read by
           all); load block 3 (+ block 8);   PROD
  round 2: store slab 3 (blocks 2-3 read by all) (+ slab 8 <- block 8).
Three PROD generations per tile (the copies landed, then two), as before; at most 4 x 16 B of codes held.

Checked here:
1. Bytes: the kernel's per-thread gather / conversion addresses, emulated on values for both layouts and both
   stages (rows zero-filled among valid ones): every copy lands once in the early-free bytes (slabs 0-3, 576: + the
   first half of slab 8); every conversion load finds its code; no byte stored in a PROD phase is loaded in that or a
   later phase; round 0 stores only into slabs 4-7; every slab byte stored once; the stage ends as the bf16 tile in
   the slab layout. Broken conversions must be caught.
2. Protocol: the producer as two actors (halves of its warpgroup), the consumers as one actor per warpgroup (T = 1-5
   tiles) and as two actors per warpgroup (its warps; T = 1-3), every interleaving (depth-first, states memoized).
   Shared memory as regions of 4 KB (each stage's slab j, rows 32h..32h+31: a code slot or half a bf16 slab), the
   flags, the scales (fp8_ds_mla), the P slab halves, the maxima, each with a content (what, tile), the writers whose
   copies / stores are done, the reads in flight (wgmma: from issue to the wait) and the designated readers still to
   read: a write into a region with a read in flight or a reader still due, or a read finding other content or a
   part not yet written, is a hazard; so is a named-barrier generation completed by arrivals alone, an actor arriving
   twice in one generation, a generation left open, a deadlock. Broken protocols must be caught.
3. The kernel's text: code_slot's expression, the producer loop's waits / copies / barriers in order, and
   convert_in_place's loads, barriers and stores for both layouts, against the model's.

    python3 benchmarks/probes/sparse_wgmma_er_emulation.py     # ~1-2 min of CPU
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc", "mla_sparse_wgmma.cu")
SLAB, BLOCK, HALF = 8192, 4096, 32 * 64  # a slab; a code block; rows r + 32 of a block are 2,048 B on
NP = 2  # producer actors


def code_slot(k):
    """Slot (slab, half) of code block k: the kernel's code_slot, byte offset 4096 * (2 * slab + half)."""
    return (((k + 4) & 7) >> 1, (k + 4) & 1) if k < 8 else (8, 0)


def code_off(k):
    return (((k + 4) & 7) if k < 8 else 16) * BLOCK


# conversion programs: ("ld", k) a code block's two chunks into registers, ("st", j) slab j from block j's
# registers, ("bar",) a PROD barrier. `mut` names a broken form.
def convert_program(ds, mut=""):
    ops = []
    for k in (4, 5, 6, 7):
        ops += [("ld", k), ("st", k)]
    ops += [("ld", 0), ("ld", 1)]
    if mut == "slab 2 in round 0":
        ops += [("ld", 2), ("st", 2)]
    if mut != "no second PROD":
        ops.append(("bar",))
    ops += [("st", 0), ("st", 1)]
    if mut != "slab 2 in round 0":
        ops += [("ld", 2), ("st", 2)]
    if mut == "block 3 read after the third PROD":
        ops += [] if ds else [("ld", 8)]
        ops.append(("bar",))
        ops += [("ld", 3), ("st", 3)] + ([] if ds else [("st", 8)])
        return ops
    ops.append(("ld", 3))
    if not ds:
        ops.append(("ld", 8))
    if mut != "no third PROD":
        ops.append(("bar",))
    ops.append(("st", 3))
    if not ds:
        ops.append(("st", 8))
    return ops


# ------------------------------------------------------------------------------------------------------------
# 1. Bytes.


def slab_off(row, byte):
    return (byte >> 7) * SLAB + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def check_bytes(ds, mut="", slot=code_off, half_step=HALF):
    """The gather (warp pw, lane l: rows 16 pw + l / 4 and + 8, chunk 4k + l % 4 of every block) and the in-place
    conversion of both stages' tiles; returns errors."""
    nblocks = 8 if ds else 9
    early = set(range(0, 4 * SLAB)) | (set() if ds else set(range(8 * SLAB, 8 * SLAB + BLOCK)))
    errors = []
    for st in (0, 1):
        valid = [(r + st) % 5 != 3 for r in range(64)]
        mem, copied = {}, set()
        for pw in range(4):
            for lane in range(32):
                q, row = lane & 3, 16 * pw + (lane >> 2)
                for k in range(nblocks):
                    for r in (row, row + 8):
                        d = slot(k) + 64 * r + 16 * q
                        for b in range(16):
                            if d + b in copied:
                                errors.append(f"stage {st}: byte {d + b} copied twice")
                            if d + b not in early:
                                errors.append(f"stage {st}: code byte copied to {d + b}, not early-free")
                            copied.add(d + b)
                            mem[d + b] = ("c", r, 64 * k + 16 * q + b) if valid[r] else 0
        progs = [convert_program(ds, mut) for _ in range(128)]
        pcs, regs = [0] * 128, [dict() for _ in range(128)]
        loads_by_phase, stores_by_phase = [], []
        while any(pcs[u] < len(progs[u]) for u in range(128)):
            loads, stores = {}, {}
            for u in range(128):
                r0, q = u >> 2, u & 3
                while pcs[u] < len(progs[u]):
                    op = progs[u][pcs[u]]
                    pcs[u] += 1
                    if op[0] == "bar":
                        break
                    k = op[1]
                    if op[0] == "ld":
                        for h in (0, 1):
                            a = slot(k) + 64 * r0 + 16 * q + h * half_step
                            r = r0 + 32 * h
                            got = [mem.get(a + b, "unwritten") for b in range(16)]
                            want = [("c", r, 64 * k + 16 * q + b) if valid[r] else 0 for b in range(16)]
                            if got != want:
                                errors.append(f"stage {st} thread {u} block {k} row {r}: loads {got[0]}, not {want[0]}")
                            regs[u][(k, h)] = got
                            for b in range(16):
                                loads.setdefault(a + b, set()).add(u)
                    else:
                        if not loads_by_phase and k not in (4, 5, 6, 7):
                            errors.append(f"stage {st} thread {u}: slab {k} stored in round 0 (before the second PROD)")
                        for h in (0, 1):
                            row, w = r0 + 32 * h, regs[u][(k, h)]
                            for e in range(16):
                                pos = (2 * q + (e >> 3)) ^ (row & 7)
                                for hb in range(2):
                                    a = SLAB * k + 128 * row + 16 * pos + 2 * (e & 7) + hb
                                    if a in stores:
                                        errors.append(f"stage {st}: byte {a} stored twice in a phase")
                                    stores[a] = ("bf16", w[e], hb)
            loads_by_phase.append(loads)
            stores_by_phase.append(stores)
            mem.update(stores)
        for p, stores in enumerate(stores_by_phase):
            for p2 in range(p, len(loads_by_phase)):
                hit = set(stores) & set(loads_by_phase[p2])
                if hit:
                    errors.append(f"stage {st}: phase {p + 1} stores {len(hit)} bytes phase {p2 + 1} loads "
                                  f"(e.g. {min(hit)})")
        every = [a for s_ in stores_by_phase for a in s_]
        if len(every) != len(set(every)) or len(every) != nblocks * SLAB:
            errors.append(f"stage {st}: {len(every)} stores to {len(set(every))} bytes, want {nblocks * SLAB} once")
        for row in range(64):
            for col in range(64 * nblocks):
                a = slab_off(row, 2 * col)
                want = ("bf16", ("c", row, col) if valid[row] else 0, 0)
                if mem.get(a) != want:
                    errors.append(f"stage {st} row {row} col {col}: {mem.get(a)} != {want}")
                    break
        if errors:
            break
    return errors


BYTE_MUTANTS = [
    ("no second PROD", {"mut": "no second PROD"}),
    ("no third PROD", {"mut": "no third PROD"}),
    ("slab 2 stored in round 0", {"mut": "slab 2 in round 0"}),
    ("block 3 read after the third PROD", {"mut": "block 3 read after the third PROD"}),
    ("blocks in slot order k (no rotation)", {"slot": lambda k: k * BLOCK}),
    ("rows r + 32 half a block on", {"half_step": 16 * 64}),
]


# ------------------------------------------------------------------------------------------------------------
# 2. Protocol. Region names: ("x", s, j, h) slab j rows 32h.. of stage s; ("fl", s); ("sc", s) (ds); "P0", "P1"
# (the P slab's key halves; ds: "P0" the float32 P0, P1 lives in slab 8); "mx0", "mx1".

MUTANTS = [
    "no WG0 wait",                 # codes gathered before warpgroup 0's release
    "no WG1 wait",                 # converted before warpgroup 1's release
    "WG0 releases after P0 V0",    # before its P1 V1 (rows 32-63 of slabs 0-3)
    "WG0 releases before H1F",     # WG1's S may still read slabs 0-3 / 8
    "releases swapped",            # WG0 arrives on WG1's barrier and back
    "block 8 in slab 4",           # 576: the ninth block in a slab warpgroup 1 still reads
    "RoPE early",                  # ds: RoPE copied with the codes (WG1's P1 still in slab 8)
    "scales early",                # ds: scales copied with the codes
    "full before RoPE landed",     # ds: no wait for the RoPE / scales copies
    "no PROD 1",
    "no PROD 2",
    "no PROD 3",
    "slab 2 in round 0",
    "release after S",
    "WG0 wait parity",             # the producer waits empty[s] with the other parity
    "empty0 counts both",          # WG0's barrier initialized for 8 warps
]


def programs(T, ds, W=1, m=frozenset()):
    """[producer actors..., consumer actors (w, x)...]."""
    nb = 8 if ds else 9
    slot = (lambda k: (4, 0) if (k == 8 and "block 8 in slab 4" in m) else code_slot(k))
    conv = convert_program(ds, "slab 2 in round 0" if "slab 2 in round 0" in m else "")
    cons_ids = [(w, x) for w in (0, 1) for x in range(W)]

    def bf16_readers(j, h):
        r = {("S", h, x) for x in range(W)}
        if j < 8:
            r |= {("PV", j // 4, h, x) for x in range(W)}
        return frozenset(r)

    fl_readers = frozenset(("fl", w, x) for w, x in cons_ids)
    sc_readers = frozenset((f, w, x) for f in ("scS", "F0", "F1") for w, x in cons_ids)
    prods = []
    for a in range(NP):
        ops = []
        for i in range(T):
            s = i & 1
            codes = [(("x", s, *slot(k)), ("code", k), frozenset(("conv", b) for b in range(NP))) for k in range(nb)]
            late = []
            if ds:
                rope = [(("x", s, 8, h), ("rope",), frozenset(("S", h, x) for x in range(W))) for h in (0, 1)]
                sc = [(("sc", s), ("sc",), sc_readers)]
                codes += (rope if "RoPE early" in m else []) + (sc if "scales early" in m else [])
                late = ([] if "RoPE early" in m else rope) + ([] if "scales early" in m else sc)
            fl = [(("fl", s), ("fl",), fl_readers)]
            if i >= 2 and "no WG0 wait" not in m:
                par = ((i - 2) >> 1) & 1
                ops.append(("mwait", f"e0_{s}", par ^ 1 if "WG0 wait parity" in m else par))
            ops += [("copy", i, tuple(codes)), ("store", i, tuple(fl))]
            if i >= 2 and "no WG1 wait" not in m:
                ops.append(("mwait", f"e1_{s}", ((i - 2) >> 1) & 1))
            if late:
                ops.append(("copy", i, tuple(late)))
            ops.append(("landed", i, tuple(r for r, _, _ in codes)))
            if "no PROD 1" not in m:
                ops.append(("sync", "PROD"))
            nbar = 0
            for op in conv:
                if op[0] == "bar":
                    nbar += 1
                    if f"no PROD {nbar + 1}" not in m:
                        ops.append(("sync", "PROD"))
                elif op[0] == "ld":
                    ops.append(("cread", i, ("x", s, *slot(op[1])), ("code", op[1])))
                else:
                    j = op[1]
                    ops.append(("store", i, tuple((("x", s, j, h), ("bf16", j), bf16_readers(j, h)) for h in (0, 1))))
            if late and "full before RoPE landed" not in m:
                ops.append(("landed", i, tuple(r for r, _, _ in late)))
            ops.append(("marrive", f"full{s}"))
        prods.append(ops)

    cons = []
    for w, x in cons_ids:
        ops = []

        def rd(kind, i, items, label):
            return (kind, i, tuple(items), label)

        def re_(items, label):
            return ("re", tuple(r for r, _ in items), label)

        for i in range(T):
            s = i & 1
            me = x
            stage_s = [(("x", s, j, w), ("rope",) if (ds and j == 8) else ("bf16", j)) for j in range(9)]
            pv = [[(("x", s, j, h), ("bf16", j)) for j in range(4 * w, 4 * w + 4)] for h in (0, 1)]
            slab8 = [(("x", s, 8, 0), ("P1",)), (("x", s, 8, 1), ("P1",))]
            sc = [(("sc", s), ("sc",))]
            rel = [("marrive", (f"e{1 - w}_{s}" if "releases swapped" in m else f"e{w}_{s}"))]
            early_rel = "release after S" in m
            ops += [("mwait", f"full{s}", (i >> 1) & 1), rd("rb", i, stage_s, ("S", w, me)), re_(stage_s, ("S", w, me))]
            if ds:
                ops.append(rd("r", i, sc, ("scS", w, me)))
            ops.append(rd("r", i, [(("fl", s), ("fl",))], ("fl", w, me)))
            if early_rel:
                ops += rel
            if w == 0:
                ops += [("w", i, ("mx0",), me, ("mx",), frozenset(("mx0", xx) for xx in range(W))), ("arrive", "MX0")]
                if ds:
                    ops.append(rd("r", i, sc, ("F0", w, me)))
                if i > 0:
                    ops.append(("sync", "P0E"))
                ops += [("w", i, ("P0",), me, ("P0",), frozenset(("P0r", xx) for xx in range(W))), ("arrive", "P0F"),
                        rd("rb", i, pv[0], ("PV", 0, 0, me))]
                if "WG0 releases before H1F" in m:
                    ops += [re_(pv[0], ("PV", 0, 0, me)), rd("rb", i, pv[1], ("PV", 0, 1, me)),
                            re_(pv[1], ("PV", 0, 1, me))] + ([] if early_rel else rel)
                ops += [("sync", "H1F"), rd("r", i, [("mx1", ("mx",))], ("mx1", me))]
                if "WG0 releases before H1F" not in m:
                    ops.append(re_(pv[0], ("PV", 0, 0, me)))
                    if "WG0 releases after P0 V0" in m and not early_rel:
                        ops += rel
                if ds:
                    ops += [rd("r", i, slab8, ("P1r", 0, me)), rd("r", i, sc, ("F1", w, me))]
                else:
                    ops.append(rd("rb", i, [("P1", ("P1",))], ("P1r", 0, me)))
                if "WG0 releases before H1F" not in m:
                    ops += [rd("rb", i, pv[1], ("PV", 0, 1, me)), re_(pv[1], ("PV", 0, 1, me))]
                if not ds:
                    ops.append(("re", ("P1",), ("P1r", 0, me)))
                if not (early_rel or {"WG0 releases after P0 V0", "WG0 releases before H1F"} & m):
                    ops += rel
            else:
                ops += [("sync", "MX0"), rd("r", i, [("mx0", ("mx",))], ("mx0", me))]
                p1 = frozenset(("P1r", ww, xx) for ww in ((0, 1) if ds else (0,)) for xx in range(W))
                ops.append(("w", i, tuple(r for r, _ in slab8) if ds else ("P1",), me, ("P1",), p1))
                ops += [("w", i, ("mx1",), me, ("mx",), frozenset(("mx1", xx) for xx in range(W))), ("arrive", "H1F"),
                        ("sync", "P0F")]
                if ds:
                    ops += [rd("r", i, [("P0", ("P0",))], ("P0r", me)), rd("r", i, sc, ("F0", w, me))]
                    if i + 1 < T:
                        ops.append(("arrive", "P0E"))
                    ops += [rd("rb", i, pv[0], ("PV", 1, 0, me)), re_(pv[0], ("PV", 1, 0, me)),
                            rd("r", i, slab8, ("P1r", 1, me)), rd("r", i, sc, ("F1", w, me))]
                else:
                    ops += [rd("rb", i, [("P0", ("P0",))] + pv[0], ("PV", 1, 0, me)),
                            ("re", ("P0",) + tuple(r for r, _ in pv[0]), ("PV", 1, 0, me))]
                    if i + 1 < T:
                        ops.append(("arrive", "P0E"))
                ops += [rd("rb", i, pv[1], ("PV", 1, 1, me)), re_(pv[1], ("PV", 1, 1, me))]
                if not early_rel:
                    ops += rel
        cons.append(ops)
    return prods + cons


class Hazard(Exception):
    """A region used out of order, a barrier generation completed wrongly, or one left open."""


# Reduction (Lipton's, as in sparse_wgmma_ds_emulation.py): an actor's step runs its ops from one boundary to the
# next at once. A step starts at a wait (mbarrier wait, bar.sync, the copies' wait) or at the end of a read in flight
# and ends after an op that lets another actor go on (an arrive) or that puts a read in flight; inside it an actor
# only reads, copies, stores and converts, and the checks only accumulate. `--op-by-op` explores op by op (W = 1,
# T <= 3) and must give the same verdicts.
MERGE = [True]
BOUNDARY = {"mwait", "sync", "re", "landed"}
STEP_END = {"rb", "arrive", "marrive"}


def check_protocol(T, ds, W=1, m=frozenset()):
    """Every interleaving: (states, final states, deadlocked states); raises Hazard."""
    progs = programs(T, ds, W, m)
    n = len(progs)
    ncons = n - NP
    who = {a: f"producer half {a}" if a < NP else f"WG{(a - NP) // W}" + (f".{(a - NP) % W}" if W > 1 else "")
           for a in range(n)}
    need = {"PROD": NP}
    e0 = 2 * W if "empty0 counts both" in m else W
    mb_count = {"full0": NP, "full1": NP, "e0_0": e0, "e0_1": e0, "e1_0": W, "e1_1": W}
    ALL_P = frozenset(range(NP))
    ALL_W = frozenset(range(W))
    DONE = frozenset({"done"})  # every writer's part of the region written / landed

    def execute(a, pc, st):
        waiting, named, mbar, reg = st
        op = progs[a][pc]
        kind = op[0]
        where = f"T={T} {'ds' if ds else '576'}: {who[a]} at {op[:2]}"
        if kind == "mwait":
            if (mbar.get(op[1], (0, 0))[1] & 1) == op[2]:
                return "blocked"
        elif kind == "marrive":
            cnt, ph = mbar.get(op[1], (0, 0))
            cnt += 1
            mbar[op[1]] = (0, ph + 1) if cnt == mb_count[op[1]] else (cnt, ph)
        elif kind in ("arrive", "sync"):
            arr, gen = named.get(op[1], (frozenset(), 0))
            if a in arr:
                raise Hazard(f"{where}: arrives twice in one generation")
            arr = arr | {a}
            if len(arr) == need.get(op[1], ncons):
                if kind == "arrive" and not any(v[0] == op[1] for v in waiting.values()):
                    raise Hazard(f"{where}: generation completed by arrivals alone")
                named[op[1]] = (frozenset(), gen + 1)
            else:
                named[op[1]] = (arr, gen)
                if kind == "sync":
                    waiting[a] = (op[1], gen)
                    return "wait"
        elif kind in ("copy", "store", "w"):
            if kind == "w":  # a consumer's store: ("w", tile, regions, part, content prefix, readers)
                items = [(r, op[4] + (op[1],), op[5]) for r in op[2]]
                part, whole = op[3], ALL_W
            else:
                items = [(r, c + (op[1],), rd) for r, c, rd in op[2]]
                part, whole = a, ALL_P
            for r, content, readers in items:
                c, land, fly, pend = reg.get(r, (None, frozenset(), frozenset(), frozenset()))
                if c != content:
                    if fly:
                        raise Hazard(f"{where}: {r} written while {sorted(fly)} read {c}")
                    if pend:
                        raise Hazard(f"{where}: {r} written before {sorted(pend)} read {c}")
                    c, land, fly, pend = content, frozenset(), frozenset(), readers
                if kind != "copy":
                    land = land | {("w", part)}
                    if land >= {("w", p_) for p_ in whole}:
                        land = DONE
                reg[r] = (c, land, fly, pend)
        elif kind == "landed":
            for r in op[2]:
                c, land, fly, pend = reg[r]
                if c is None or c[-1] != op[1]:
                    raise Hazard(f"{where}: copies land in {r}, which holds {c}")
                land = land | {("w", a)}
                if land >= {("w", p_) for p_ in ALL_P}:
                    land = DONE
                reg[r] = (c, land, fly, pend)
        elif kind == "cread":
            r, content = op[2], op[3] + (op[1],)
            c, land, fly, pend = reg.get(r, (None, frozenset(), frozenset(), frozenset()))
            if c != content:
                raise Hazard(f"{where}: {r} holds {c}, not {content}")
            if land != DONE:
                raise Hazard(f"{where}: {r} read before every producer's copies landed")
            reg[r] = (c, land, fly, pend - {("conv", a)})
        elif kind in ("r", "rb"):
            _, i, items, label = op
            for r, prefix in items:
                c, land, fly, pend = reg.get(r, (None, frozenset(), frozenset(), frozenset()))
                if c != prefix + (i,):
                    raise Hazard(f"{where}: {r} holds {c}, wanted {prefix + (i,)}")
                if land != DONE:
                    raise Hazard(f"{where}: {r} read before it was completely written")
                lab = ("P0r", label[-1]) if r == "P0" else label
                reg[r] = (c, land, fly | {label} if kind == "rb" else fly, pend - {lab})
        elif kind == "re":
            for r in op[1]:
                c, land, fly, pend = reg[r]
                reg[r] = (c, land, fly - {op[2]}, pend)
        else:
            raise AssertionError(f"unknown op {op}")
        return "done"

    init = (tuple([0] * n), frozenset(), frozenset(), frozenset(), frozenset())
    seen, deadlocks, finals = set(), [], 0
    stack = [init]
    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        pcs = st[0]
        if all(pcs[a] == len(progs[a]) for a in range(n)) and not st[1]:
            finals += 1
            if any(arr for arr, _ in dict(st[2]).values()):
                raise Hazard(f"T={T}: barrier left open at exit")
            continue
        moved = False
        for a in range(n):
            if pcs[a] == len(progs[a]):
                continue
            cur = [dict(x) for x in st[1:]]
            pcs2 = list(pcs)
            waiting = cur[0]
            if a in waiting:
                bid, gen = waiting[a]
                if dict(cur[1]).get(bid, (frozenset(), 0))[1] == gen:
                    continue
                del waiting[a]
                pcs2[a] += 1
            else:
                status = execute(a, pcs2[a], cur)
                if status == "blocked":
                    continue
                if status == "done":
                    pcs2[a] += 1
            # the actor's following ops up to the next boundary run in the same step (MERGE)
            while MERGE[0] and a not in waiting and 0 < pcs2[a] < len(progs[a]) and \
                    progs[a][pcs2[a]][0] not in BOUNDARY and progs[a][pcs2[a] - 1][0] not in STEP_END:
                execute(a, pcs2[a], cur)
                pcs2[a] += 1
            nxt = (tuple(pcs2),) + tuple(frozenset(d.items()) for d in cur)
            if nxt not in seen:
                stack.append(nxt)
            moved = True
        if not moved:
            deadlocks.append({who[a]: progs[a][pcs[a]][:2] for a in range(n) if pcs[a] < len(progs[a])})
    return len(seen), finals, deadlocks


# ------------------------------------------------------------------------------------------------------------
# 3. The kernel's text.


def _block_end(text, i):
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    raise AssertionError("unbalanced braces")


def specialize(text, ds):
    """`if constexpr (kDs) A else B` / `if constexpr (!kDs) A` resolved for the instance."""
    while True:
        mt = re.search(r"if constexpr \((!?)kDs\)\s*", text)
        if not mt:
            return text
        i = mt.end()
        end = _block_end(text, i) if text[i] == "{" else text.index(";", i) + 1
        body, rest = text[i:end], text[end:]
        me = re.match(r"\s*else\s*", rest)
        other = ""
        if me:
            j = me.end()
            k = _block_end(rest, j) if rest[j] == "{" else rest.index(";", j) + 1
            other, rest = rest[j:k], rest[k:]
        take = body if ds != bool(mt.group(1)) else other
        text = text[:mt.start()] + take + rest


def check_source(path=SRC):
    text = re.sub(r"//[^\n]*", "", open(path).read())
    errors = []
    mt = re.search(r"constexpr int code_slot\(int k\) \{ return ([^;]*); \}", text)
    if not mt:
        errors.append("code_slot not found")
    else:
        expr = mt.group(1).replace("kCodeBlock", str(BLOCK)).replace("kSlab", str(SLAB))
        expr = re.sub(r"(.*) \? (.*) : (.*)", r"(\2) if \1 else (\3)", expr).replace("&&", "and")
        got = [eval(expr, {"__builtins__": {}}, {"k": k}) for k in range(9)]
        if got != [code_off(k) for k in range(9)]:
            errors.append(f"code_slot gives {got}, the model {[code_off(k) for k in range(9)]}")
    if not re.search(r"for \(int j = 0; j < 4; \+\+j\) mbar_init\(&empty\[j\], 4\);", text):
        errors.append("the four release mbarriers are not initialized for 4 warps each")
    if "release_stage(empty + 2 * wg, s, lane);" not in text:
        errors.append("a consumer warpgroup does not release on its own mbarrier")
    conv = text[text.index("void convert_in_place(uint8_t* stage, int u) {"):]
    conv = conv[:_block_end(conv, conv.index("{"))]
    prod = text[text.index("for (int i = 0; i < ntiles; ++i) {"):]
    prod = prod[:_block_end(prod, prod.index("{"))]
    for ds in (False, True):
        c = specialize(conv, ds)
        got = []
        rx = (r"for \(int k = 4; k < 8; \+\+k\) \{\s*const uint4 w0 = load\(k, 0\), w1 = load\(k, 1\);\s*"
              r"store\(k, w0, w1\);\s*\}|w(\d)0 = load\((\d), 0\)|nb_sync|store\((\d), w(\d)0, w(\d)1\)")
        for m_ in re.finditer(rx, c):
            if m_.group(0).startswith("for"):
                got += [x for k in (4, 5, 6, 7) for x in (("ld", k), ("st", k))]
            elif m_.group(0) == "nb_sync":
                got.append(("bar",))
            elif m_.group(1):
                if m_.group(1) != m_.group(2):
                    errors.append(f"register w{m_.group(1)}0 loads block {m_.group(2)}")
                got.append(("ld", int(m_.group(2))))
            else:
                if not m_.group(3) == m_.group(4) == m_.group(5):
                    errors.append(f"slab {m_.group(3)} stored from w{m_.group(4)}0 / w{m_.group(5)}1")
                got.append(("st", int(m_.group(3))))
        if got != convert_program(ds):
            errors.append(f"convert_in_place<{str(ds).lower()}>: kernel {got} != model {convert_program(ds)}")
        pt = specialize(prod, ds)
        toks = []
        for m_ in re.finditer(r"mbar_wait\(&empty\[(2 \+ )?s\]|gather_codes<|gather_rope\(|cp_async_wait<([^>]*)>"
                              r"|nb_sync<kProducerThreads>\(kBarProd\)|convert_in_place<|mbar_arrive\(&full", pt):
            g = m_.group(0)
            toks.append("mwait e1" if m_.group(1) else "mwait e0" if g.startswith("mbar_wait") else
                        "copy" if g.startswith("gather") else "landed" if g.startswith("cp_async") else
                        "sync PROD" if g.startswith("nb_sync") else "convert" if g.startswith("convert") else
                        "marrive full")
            if g.startswith("cp_async") and m_.group(2) not in (("kDs ? 1 : 0", "0") if ds else ("kDs ? 1 : 0",)):
                errors.append(f"cp_async_wait<{m_.group(2)}> in the producer loop")
        want = []
        for op in programs(3, ds)[0][next(n for n, o in enumerate(programs(3, ds)[0]) if o[0] == "mwait"):]:
            k = op[0]
            tok = {"mwait": lambda: "mwait " + op[1][:2], "copy": lambda: "copy", "landed": lambda: "landed",
                   "sync": lambda: "sync PROD", "cread": lambda: "convert", "store": lambda: None if
                   op[2][0][0][0] == "fl" else "convert", "marrive": lambda: "marrive full"}[k]()
            if tok and (not want or want[-1] != tok or tok != "convert"):
                want.append(tok)
        # the model's conversion (reads, PROD barriers, stores) is convert_in_place's body, checked above
        i0 = want.index("sync PROD")
        want = want[:i0 + 1] + ["convert"] + [w for w in want[i0 + 1:] if w not in ("convert", "sync PROD")]
        if toks != want:
            errors.append(f"producer loop ({'ds' if ds else '576'}): kernel {toks} != model {want}")
    return errors


def applies(name, ds):
    return not ((ds and name == "block 8 in slab 4") or
                (not ds and name in ("RoPE early", "scales early", "full before RoPE landed")))


def check_mutants(ds, W=1, tiles=4):
    caught = total = 0
    for name in MUTANTS:
        if not applies(name, ds):
            continue
        total += 1
        found = None
        for T in range(1, tiles + 1):
            try:
                _, _, dl = check_protocol(T, ds, W, frozenset({name}))
                if dl:
                    found = f"deadlock at T={T}: {dl[0]}"
            except (Hazard, AssertionError, KeyError) as e:
                found = f"{type(e).__name__}: {e}"
            if found:
                break
        print(f"  mutant '{name}': {'caught: ' + found[:150] if found else 'NOT caught'}")
        caught += bool(found)
    return caught == total


def main(argv) -> int:
    bad = 0
    tiles = int(argv[argv.index("--tiles") + 1]) if "--tiles" in argv else 5
    plan = ((1, tiles), (2, 3))
    if "--op-by-op" in argv:
        MERGE[0] = False
        plan, tiles = ((1, 3),), 3
    errors = check_source()
    print(f"the kernel's text (code_slot, the release mbarriers, convert_in_place and the producer loop of both "
          f"instances) against the model: {'OK' if not errors else 'FAIL: ' + '; '.join(errors)}")
    bad += bool(errors)
    for ds in (False, True):
        lay = "656-byte rows (fp8_ds_mla)" if ds else "576-byte rows"
        print(f"== {lay}")
        errors = check_bytes(ds)
        print(f"bytes (gather + in-place conversion, both stages, zero-filled rows): "
              f"{'OK' if not errors else 'FAIL: ' + '; '.join(errors[:3])}")
        bad += bool(errors)
        print("broken conversions (must all be caught):")
        for name, kw in BYTE_MUTANTS:
            errors = check_bytes(ds, **kw)
            print(f"  '{name}': {'caught: ' + errors[0] if errors else 'NOT caught'}")
            bad += not errors
        for W, n in plan:
            print(f"protocol ({NP} producer actors + {W} actor(s) per consumer warpgroup, every interleaving):")
            for T in range(1, n + 1):
                try:
                    nst, finals, dl = check_protocol(T, ds, W)
                except (Hazard, AssertionError) as e:
                    print(f"  T={T}: HAZARD {e}")
                    bad += 1
                    continue
                print(f"  T={T}: {nst} states, {finals} final, {len(dl)} deadlocked")
                bad += bool(dl) + (finals != 1)
        print("broken protocols (must all be caught; T <= 4):")
        bad += not check_mutants(ds, 1, min(tiles, 4))
    print("ALL PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
