"""CPU check of the cuda sparse decode kernel's fp8_ds_mla variant (sparse_decode_kernel<kDs> in
csrc/mla_sparse_wgmma.cu, 656-byte rows), no GPU needed. The kernel's 576-byte instance is variant S, checked by
sparse_wgmma_s_emulation.py (imported here: slab_off and its producer program, whose barrier skeleton kDs keeps);
the consumers' barrier skeleton is decode_wgmma_z_emulation.py's variant Z (imported, compared op for op).

0. Constants: read from the kernel source (constexpr ints), so a change of kCodeOffDs, kOffScales, kDsRope, ...
   changes what is checked; the shared-memory regions (Q's latent slabs, the two stages' scale arrays in Q's slab 8,
   the stages, the P slab, maxima, flags, mbarriers) are disjoint and fit kSmemBytes.
1. Bytes, as the kernel's threads address them: gather_tile<true> (warp pw, lane l: 8 code chunks of rows a and b
   into the code blocks at kCodeOffDs, RoPE chunks 2q, 2q+1 into slab 8 at slab_off, scales of row a or b into the
   stage's [64][4] float32 array), then convert_in_place<true> (thread u: rows u/4 and u/4 + 32, chunk u % 4 of
   blocks 0-7; phases between its PROD barriers: 1 = slabs 0-3 stored, blocks 4-5 read; 2 = slabs 4-5 stored,
   blocks 6-7 read, slab 6 stored; 3 = slab 7 stored). The conversion is emulated on values (a store writes what
   its thread's load returned), on tiles with valid and zero-filled rows in both stages. Checked: every cp.async
   byte written once and only inside its stage or its stage's scale array; every conversion load finds the code
   it expects; no byte stored in a phase is read (by any thread) in that or a later phase; no byte stored twice;
   the stage ends as the [64 x 576] bf16 tile in the slab layout (slabs 0-7 the codes as bf16, slab 8 the RoPE
   values) and the scale array as the rows' four float32 scales. The consumers' side of the same bytes: S's
   latent k16 steps of block j cover values 128j..128j+127 (acc[j % 2], scale j), its RoPE steps cover values
   512..575 in slab 8, load_qrope's fragments hold the A layout's (row, column), add_scaled / scaled_fragments
   read the scale of the accumulator's own key, store_p32 / load_p32 cover the 8 KB slab once and hand thread t
   of one warpgroup the other's same positions, pv_scaled's block b of warpgroup w reads V columns 256w + 128b..
   with scale 2w + b. Seven broken forms of the producer must be caught.
2. Protocol: the producer as two actors (halves of its warpgroup, as in S's model) and the consumers as one actor
   per warpgroup (T = 1-4 tiles), then as two actors per warpgroup standing for its warps (T = 1-3: per-warp
   drift, the barrier counts in warps), programs transcribed from the kernel and checked against its text (the
   tile loops specialized for kDs, scanned for barrier and shared-memory operations in source order, and
   convert_in_place<true>'s loads, barriers and stores). Every interleaving of the actors' steps (depth-first,
   states memoized; a step = an actor's ops from one wait to the next release-like op, Lipton's reduction, see
   MERGE; `--op-by-op` explores op by op, T <= 3, with the same verdicts). Shared memory as regions with a
   content (what, tile), the producer copies that have landed, the reads in flight and the designated readers
   still to come: a write (cp.async or store) into a region with a read in flight or a designated reader still
   to read is a hazard, and so is a read that finds other content or copies not yet landed. Regions: the stage's
   code blocks / bf16 slabs 0-7 (S's model: gather, landed, per-actor block reads and slab stores, the
   conversion complete before a consumer uses the stage, refilled only after every consumer released it), the
   stage's RoPE slab (the RoPE values, read by both warpgroups' S; then warpgroup 1's float32 P1 by warp part,
   read by warpgroup 0 and by warpgroup 1 again, before the slab is refilled), the stage's scale array (read by
   S and by each warpgroup's two fragment builds), the flags, the P slab (P0), the maxima, Q, the final row sums.
   Named barriers count arrivals with the hardware's rule (a generation completes when its arrivals reach the
   count, whoever arrives); an actor arriving twice in one generation, a generation completed by arrivals alone,
   or one left open at exit is a hazard. No deadlock: every interleaving ends with all actors finished.
   Nineteen broken protocols must be caught (P1 written before the other warpgroup's S finished, the scales read
   after the release, a missing PROD barrier, ...), three of them again with two actors per warpgroup.

    python3 benchmarks/probes/sparse_wgmma_ds_emulation.py     # ~25 s of CPU
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_wgmma_z_emulation as z  # noqa: E402  (variant Z's consumer programs: the barrier skeleton)
import sparse_wgmma_s_emulation as s  # noqa: E402  (variant S: slab_off, its producer program)

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "csrc", "mla_sparse_wgmma.cu")
SEESAW = os.path.join(os.path.dirname(SRC), "seesaw.cuh")  # the constants and helpers it shares with the decode


# ------------------------------------------------------------------------------------------------------------
# 0. Constants and the region map.


def kernel_constants(path=SRC):
    """The kernel's `constexpr int` names and values (seesaw.cuh's first; expressions evaluated in source order)."""
    text = re.sub(r"//[^\n]*", "", open(SEESAW).read() + open(path).read())
    env = {}
    for decl in re.findall(r"constexpr int ([^;]*);", text):
        for part in decl.split(","):
            name, _, expr = part.partition("=")
            name = name.strip()
            if not re.fullmatch(r"k\w+", name):
                continue
            try:
                env[name] = int(eval(expr.replace("/", "//"), {"__builtins__": {}}, dict(env)))
            except Exception:  # a template's conditional: not a plain constant
                pass
    return env


C = kernel_constants()
SLAB, TILE, BLOCK = C["kSlab"], C["kTileBytes"], C["kCodeBlock"]
CODE_OFF, OFF_SCALES = C["kCodeOffDs"], C["kOffScales"]
ROW, DS_SCALES, DS_ROPE = C["kRowDs"], C["kDsScales"], C["kDsRope"]
KEYS, NOPE, DIM = C["kKeys"], C["kNope"], C["kDim"]
SCALES_BYTES = 16 * KEYS  # one stage's [64 slots][4] float32 (sscale + 16 * kKeys * s in the kernel)


def stage_base(st):
    return TILE * (1 + st)  # sk0 = sq + kTileBytes, stage s at sk0 + s * kTileBytes


def scales_base(st):
    return OFF_SCALES + SCALES_BYTES * st


def check_regions():
    """The kDs instance's shared-memory regions (bytes from the 1024-aligned sq) are disjoint and fit."""
    regions = [("Q latent slabs 0-7", 0, 8 * SLAB)]
    regions += [(f"scales of stage {st}", scales_base(st), SCALES_BYTES) for st in (0, 1)]
    regions += [(f"stage {st}", stage_base(st), TILE) for st in (0, 1)]
    regions += [("P slab", C["kOffP"], SLAB), ("maxima + row sums", C["kOffX"], 4 * C["kHeads"] * 4),
                ("flags", C["kOffValid"], 2 * KEYS), ("mbarriers", C["kOffBar"], 4 * 8)]
    errors = []
    for n1, a1, l1 in regions:
        for n2, a2, l2 in regions:
            if n1 < n2 and a1 < a2 + l2 and a2 < a1 + l1:
                errors.append(f"{n1} [{a1}, {a1 + l1}) meets {n2} [{a2}, {a2 + l2})")
    end = max(a + n for _, a, n in regions)
    if end + 1024 > C["kSmemBytes"] or C["kSmemBytes"] > 232448:
        errors.append(f"regions end at {end}: kSmemBytes {C['kSmemBytes']} lacks the 1024 B alignment slack")
    if not (8 * SLAB <= scales_base(0) and scales_base(1) + SCALES_BYTES <= TILE):
        errors.append("the scale arrays are not inside Q's slab 8")
    return errors, end


# ------------------------------------------------------------------------------------------------------------
# 1. Bytes: the producer's per-thread addresses, emulated on values; the consumers' reads of the same bytes.
# A cache byte is ("c", slot, byte) for a valid slot, 0 for a zero-filled one; a converted value ("bf16", code, h)
# (byte h of the bf16 of that code byte).


def slab_off(row, byte):
    return s.slab_off(row, byte)  # the kernel's slab_off (64-row slabs): S's model, imported


def gather_bytes(st, valid, code_off=CODE_OFF, rope_swizzle=True, scale_row_b_from_a=False):
    """gather_tile<true> for stage st: [(shared address, value, producer thread)], one per byte."""
    out = []
    stage, scales = stage_base(st), scales_base(st)

    def src(slot, byte):
        return ("c", slot, byte) if valid[slot] else 0

    for pw in range(4):
        for lane in range(32):
            q, row = lane & 3, 16 * pw + (lane >> 2)
            u = 32 * pw + lane
            ra, rb = row, row + 8  # __shfl_sync(off, lane >> 2) and (lane >> 2) + 8: rows 16 pw + l / 4 and + 8
            dst = stage + code_off + 64 * row + 16 * q
            for k in range(8):
                for d, r in ((dst + BLOCK * k, ra), (dst + BLOCK * k + 64 * 8, rb)):
                    out += [(d + b, src(r, 64 * k + 16 * q + b), u) for b in range(16)]
            rope = stage + 8 * SLAB
            for c in (2 * q, 2 * q + 1):
                for r in (ra, rb):
                    d = rope + (slab_off(r, 16 * c) if rope_swizzle else 128 * r + 16 * c)
                    out += [(d + b, src(r, DS_ROPE + 16 * c + b), u) for b in range(16)]
            if q < 2:
                r = row + 8 * q
                sr = ra if (scale_row_b_from_a or q == 0) else rb
                out += [(scales + 16 * r + b, src(sr, DS_SCALES + b), u) for b in range(16)]
    return out


def convert_ops(u, code_off=CODE_OFF, half_step=32 * 64, block5_late=False, prod2=True, prod3=True):
    """convert_in_place<true>, thread u: a list of ("ld", reg, address) / ("st", slab, row, q, reg) / ("bar",)
    in program order (the PROD barriers as ("bar",); a dropped one: the phases merge)."""
    r, q = u >> 2, u & 3
    code = code_off + 64 * r + 16 * q

    def ld(k, h):
        return ("ld", (k, h), code + BLOCK * k + h * half_step)

    def st(k, h):
        return ("st", k, r + 32 * h, q, (k, h))

    ops = []
    for k in range(4):  # slabs 0-3: below the codes
        ops += [ld(k, 0), ld(k, 1), st(k, 0), st(k, 1)]
    ops += [ld(4, 0), ld(4, 1)] + ([] if block5_late else [ld(5, 0), ld(5, 1)])
    ops += [("bar",)] if prod2 else []
    ops += [st(4, 0), st(4, 1)] + ([ld(5, 0), ld(5, 1)] if block5_late else []) + [st(5, 0), st(5, 1)]
    ops += [ld(6, 0), ld(6, 1), ld(7, 0), ld(7, 1), st(6, 0), st(6, 1)]
    ops += [("bar",)] if prod3 else []
    ops += [st(7, 0), st(7, 1)]
    return ops


def check_producer_bytes(code_off=CODE_OFF, rope_swizzle=True, scale_row_b_from_a=False, **conv):
    """Both stages, a tile with every 5th slot zero-filled; returns the first errors (empty: all checks pass)."""
    errors = []
    mem = {}
    for st in (0, 1):
        valid = [(r + st) % 5 != 3 for r in range(KEYS)]
        stage = stage_base(st)
        # phase 0: the cp.async copies (landed before the first PROD barrier)
        written = {}
        for a, v, u in gather_bytes(st, valid, code_off, rope_swizzle, scale_row_b_from_a):
            if a in written:
                errors.append(f"stage {st}: byte {a} copied by threads {written[a]} and {u}")
            written[a] = u
            if not (stage <= a < stage + TILE or scales_base(st) <= a < scales_base(st) + SCALES_BYTES):
                errors.append(f"stage {st}: thread {u} copies to byte {a}, outside the stage and its scales")
            mem[a] = v
        # phases 1..: the conversion, by PROD barrier phases; loads see the memory at the phase's start
        progs = [convert_ops(u, code_off, **conv) for u in range(128)]
        pcs, regs = [0] * 128, [dict() for _ in range(128)]
        phase, stores_by_phase, loads_by_phase = 0, [], []
        while any(pcs[u] < len(progs[u]) for u in range(128)):
            phase += 1
            loads, stores = {}, {}
            for u in range(128):
                while pcs[u] < len(progs[u]):
                    op = progs[u][pcs[u]]
                    pcs[u] += 1
                    if op[0] == "bar":
                        break
                    if op[0] == "ld":
                        a = stage + op[2]
                        regs[u][op[1]] = [mem.get(a + b, "unwritten") for b in range(16)]
                        for b in range(16):
                            loads.setdefault(a + b, set()).add(u)
                        k, h = op[1]
                        r = (u >> 2) + 32 * h
                        want = [("c", r, 64 * k + 16 * (u & 3) + b) if valid[r] else 0 for b in range(16)]
                        if regs[u][op[1]] != want:
                            errors.append(f"stage {st} thread {u} block {k} row {r}: loads "
                                          f"{regs[u][op[1]][0]}.. not its code {want[0]}..")
                    else:  # store_chunk<bf16>: codes 0-7 -> 16-byte position 2q, 8-15 -> 2q + 1, swizzled by row
                        _, k, row, q, reg = op
                        w = regs[u][reg]
                        for e in range(16):
                            pos = (2 * q + (e >> 3)) ^ (row & 7)
                            for h in range(2):
                                a = stage + SLAB * k + 128 * row + 16 * pos + 2 * (e & 7) + h
                                if a in stores:
                                    errors.append(f"stage {st}: byte {a} stored by threads {stores[a][0]} and {u}")
                                stores[a] = (u, ("bf16", w[e], h))
            loads_by_phase.append(loads)
            stores_by_phase.append(stores)
            for a, (u, v) in stores.items():
                mem[a] = v
        for p, stores in enumerate(stores_by_phase):
            for p2 in range(p, len(loads_by_phase)):
                hit = set(stores) & set(loads_by_phase[p2])
                if hit:
                    errors.append(f"stage {st}: phase {p + 1} stores {len(hit)} bytes that phase {p2 + 1} loads "
                                  f"(e.g. byte {min(hit)})")
        every = [a for st_ in stores_by_phase for a in st_]
        if len(every) != len(set(every)) or len(every) != 8 * SLAB:
            errors.append(f"stage {st}: {len(every)} stores to {len(set(every))} bytes, want {8 * SLAB} once each")
        # the stage as the consumers read it: the [64 x 576] bf16 tile in the slab layout, and the scales
        for row in range(KEYS):
            for col in range(DIM):
                for h in range(2):
                    a = stage + slab_off(row, 2 * col + h)
                    if col < NOPE:
                        want = ("bf16", ("c", row, col) if valid[row] else 0, h)
                    else:
                        want = ("c", row, DS_ROPE + 2 * (col - NOPE) + h) if valid[row] else 0
                    if mem.get(a, "unwritten") != want:
                        errors.append(f"stage {st} row {row} col {col} byte {h}: holds {mem.get(a, 'unwritten')}, "
                                      f"want {want}")
                        break
            for b in range(16):
                want = ("c", row, DS_SCALES + b) if valid[row] else 0
                if mem.get(scales_base(st) + 16 * row + b, "unwritten") != want:
                    errors.append(f"stage {st} row {row}: scale byte {b} holds "
                                  f"{mem.get(scales_base(st) + 16 * row + b, 'unwritten')}, want {want}")
                    break
        if len(errors) > 20:
            break
    return errors


def acc_pos(t, n):
    """m64nN wgmma accumulator element n of thread t (of its warpgroup): (row, column)."""
    return 16 * (t >> 5) + ((t & 31) >> 2) + 8 * ((n >> 1) & 1), 8 * (n >> 2) + 2 * (t & 3) + (n & 1)


def afrag_pos(t, ks, i, half):
    """m64k16 A fragment register i (half: low / high bf16) of thread t at k16 step ks: (row, column)."""
    return 16 * (t >> 5) + ((t & 31) >> 2) + 8 * (i & 1), 16 * ks + 2 * (t & 3) + 8 * (i >> 1) + half


def check_consumer_bytes():
    """The consumers' addressing of the stage, the scales, Q's RoPE and the float32 P exchange (kernel lines
    cited per check); returns errors."""
    errors = []
    # S, latent block j: kmajor_desc(sq / kw, 256 j + 32 ks) for ks < 8 covers values 128 j .. 128 j + 127, the
    # values scale j multiplies (add_scaled(..., j) after acc[j % 2]'s group)
    for j in range(4):
        cols = {(256 * j + 32 * ks + b) // 2 for ks in range(8) for b in range(32)}
        if cols != set(range(128 * j, 128 * j + 128)):
            errors.append(f"S block {j}'s k16 steps cover other values than scale {j}'s")
    if {(2 * NOPE + 32 * ks + b) // 2 for ks in range(4) for b in range(32)} != set(range(NOPE, DIM)) or \
            {(2 * NOPE + 32 * ks) >> 7 for ks in range(4)} != {8}:
        errors.append("S's RoPE k16 steps do not cover values 512..575 in slab 8")
    # S, RoPE: kmajor_desc(kw, kNope * 2 + 32 ks) reads values 512 + 16 ks.. of K rows 32 w..; load_qrope's
    # fragment qr[ks][i] must hold Q's values at the A layout's (row, column) of the same k16 step
    for t in range(128):
        row_lo = 16 * (t >> 5) + ((t & 31) >> 2)
        for ks in range(4):
            c = (16 * ks + 2 * (t & 3)) // 2  # load_qrope: u32 index into the row's RoPE, rows lo / hi = lo + 8
            got = [(row_lo, 2 * c), (row_lo + 8, 2 * c), (row_lo, 2 * (c + 4)), (row_lo + 8, 2 * (c + 4))]
            for i in range(4):
                for half in range(2):
                    r, col = afrag_pos(t, ks, i, half)
                    if (got[i][0], got[i][1] + half) != (r, col):
                        errors.append(f"load_qrope thread {t} ks {ks} reg {i}: value {got[i]}, A layout wants "
                                      f"{(r, col)}")
    # add_scaled / scaled_fragments: the scale read for accumulator element n is its own key's
    for w in (0, 1):
        for t in range(128):
            for n in range(16):
                key = 32 * w + 8 * (n >> 2) + 2 * (t & 3) + (n & 1)  # add_scaled's key (key0 = 32 wg)
                if key != 32 * w + acc_pos(t, n)[1]:
                    errors.append(f"add_scaled thread {t} n {n}: scale of key {key}")
                if not 0 <= 4 * (4 * key + 3) < SCALES_BYTES:
                    errors.append(f"scale read outside the stage's array: key {key}")
            for ks in range(2):
                for i in range(4):  # a[ks][i] = bf16x2(e[n] * sc[key], e[n + 1] * sc[key + 1]), n = 8 ks + 2 i
                    n = 8 * ks + 2 * i
                    key = 8 * (n >> 2) + 2 * (t & 3)
                    for half in range(2):
                        if acc_pos(t, n + half) != afrag_pos(t, ks, i, half) or key + half != acc_pos(t, n + half)[1]:
                            errors.append(f"scaled_fragments thread {t} ks {ks} reg {i}: element {n + half} at "
                                          f"{acc_pos(t, n + half)}, A layout {afrag_pos(t, ks, i, half)}, key {key}")
    # store_p32 / load_p32: the 8 KB slab written once; thread t of the other warpgroup reads e[n] at the same
    # positions (same rows, the other 32 keys)
    where = {}
    for t in range(128):
        for n in range(16):
            a = 16 * (128 * (n >> 2) + t) + 4 * (n & 3)
            where.setdefault(a, []).append((t, n))
    if sorted(where) != list(range(0, SLAB, 4)) or any(len(v) != 1 for v in where.values()):
        errors.append("store_p32 does not cover the 8 KB slab once")
    # pv_scaled: block b of warpgroup w reads V at sv + 2 kSlab b (sv = stage + 4 w kSlab), 128 columns (LBO one
    # slab), into o[64 b ..]; its A = P times scale 2 w + b (WG0: scaled_fragments j 0, 1; WG1: j 2, 3)
    for w in (0, 1):
        for b in (0, 1):
            slab0 = 4 * w + 2 * b
            cols = set(range(64 * slab0, 64 * slab0 + 128))
            if {c // 128 for c in cols} != {2 * w + b}:
                errors.append(f"warpgroup {w} block {b}: V columns {min(cols)}.. not under scale {2 * w + b}")
            for t in range(128):  # store_rows: o[j] at column 256 w + 2 (t % 4) + 8 (j / 4) + j % 2
                for m in range(64):
                    col = 256 * w + 2 * (t & 3) + 8 * ((64 * b + m) >> 2) + (m & 1)
                    if col != 64 * slab0 + acc_pos(t, m)[1]:
                        errors.append(f"warpgroup {w} block {b} thread {t}: o[{64 * b + m}] stored at column {col}")
                        break
    return errors


def p1_rows_by_warp():
    """Slab-8 rows each consumer warp's store_p32 writes (16 (128 i + t) bytes, 128 B per row)."""
    return {x: sorted({(16 * (128 * i + t)) // 128 for i in range(4) for t in range(32 * x, 32 * x + 32)})
            for x in range(4)}


# ------------------------------------------------------------------------------------------------------------
# 2. Protocol.

NP = 2  # producer actors


def overlaps(j, k):
    """Slab j's bytes meet code block k's (both in one stage; kDs: blocks at kCodeOffDs)."""
    return SLAB * j < CODE_OFF + BLOCK * (k + 1) and CODE_OFF + BLOCK * k < SLAB * (j + 1)


OVERLAPS = {j: [k for k in range(8) if overlaps(j, k)] for j in range(8)}


def kds_programs(T, W=1, m=frozenset()):
    """[producer actors..., consumer actors (w, x)...] for T tiles, W actors per consumer warpgroup; m: names of
    broken variants (MUTANTS). Producer: the kernel's producer branch (csrc/mla_sparse_wgmma.cu lines 521-539 at
    this writing) with gather_tile<true> (216-245) and convert_in_place<true> (263-306); consumers: Q's load and
    the `it` loop (541-755). check_against_source compares them with the text."""
    def parts_all():
        return tuple(range(W))

    S_READERS = frozenset(("S", w, x) for w in (0, 1) for x in range(W))
    SC_READERS = S_READERS | frozenset((f, w, x) for f in ("F0", "F1") for w in (0, 1) for x in range(W))
    FL_READERS = frozenset(("fl", w, x) for w in (0, 1) for x in range(W))

    def sc(st):
        return "sc0" if "one scale array" in m else f"sc{st}"

    prods = []
    for _ in range(NP):
        ops = []
        for i in range(T):
            st = i & 1
            if i >= 2 and "no empty wait" not in m:
                ops.append(("mwait", f"empty{st}", ((i - 2) >> 1) & 1))
            copies = tuple([(f"rope{st}", p, "rope", S_READERS) for p in parts_all()] +
                           [(sc(st), 0, "sc", SC_READERS), (f"fl{st}", 0, "fl", FL_READERS)])
            ops.append(("gather", i, copies))  # gather_tile<true>: cp.async codes, RoPE, scales; flags
            if "full before landed" in m:
                ops.append(("marrive", f"full{st}"))
            ops.append(("landed", i, copies))  # cp_async_wait_all
            if "no PROD 1" not in m:
                ops.append(("sync", "PROD"))
            for k in range(4):
                ops += [("cread", i, k), ("cwrite", i, k)]
            ops += [("cread", i, 4), ("cread", i, 5)]
            if "no PROD 2" not in m:
                ops.append(("sync", "PROD"))
            ops += [("cwrite", i, 4), ("cwrite", i, 5), ("cread", i, 6), ("cread", i, 7), ("cwrite", i, 6)]
            if "no PROD 3" not in m:
                ops.append(("sync", "PROD"))
            ops.append(("cwrite", i, 7))
            if "full before landed" not in m:
                ops.append(("marrive", f"full{st}"))
        prods.append(ops)

    cons = []
    for w in (0, 1):
        for x in range(W):
            me = (w, x)
            ops = [("w", "Q", me, "q", 0, frozenset())]  # load_query: every consumer thread stores chunks
            if "no ALL after Q" not in m:
                ops.append(("sync", "ALL"))
            for i in range(T):
                st = i & 1
                rope = f"rope{st}"
                p1_slab = f"rope{1 - st}" if "P1 in the other stage" in m else rope
                release = [("use", i), ("release", i), ("marrive", f"empty{st}")]
                if "release after S" in m:
                    release = [("release", i), ("marrive", f"empty{st}")]
                ops += [("mwait", f"full{st}", (i >> 1) & 1), ("use", i),
                        ("rb", rope, parts_all(), "rope", i, ("S", w, x)),
                        ("r", "Q", tuple((ww, xx) for ww in (0, 1) for xx in range(W)), "q", 0, ("S", w, x))]
                s_end = [("re", rope, parts_all(), ("S", w, x)), ("r", sc(st), (0,), "sc", i, ("S", w, x))]
                if w == 1 and "P1 before own S ends" in m:
                    ops += [("w", p1_slab, x, "P1", i, frozenset({("P1", 0, x), ("P1", 1, x)}))]
                ops += s_end + [("r", f"fl{st}", (0,), "fl", i, ("fl", w, x))]
                if "release after S" in m:
                    ops += release
                if w == 0:
                    ops += [("w", "mx0", x, "mx", i, frozenset({("mx0", x)}))]
                    if "no MX0" not in m:
                        ops.append(("arrive", "MX0"))
                    ops.append(("r", sc(st), (0,), "sc", i, ("F0", w, x)))
                    if i > 0 and "no P0E" not in m:
                        ops.append(("sync", "P0E"))
                    ops += [("w", "P0", x, "P0", i, frozenset({("P0", x)})), ("arrive", "P0F"), ("use", i)]
                    p1_read = [("r", p1_slab, (x,), "P1", i, ("P1", 0, x))]
                    if "WG0 reads P1 before H1F" in m:
                        ops += p1_read
                    ops += [("sync", "H1F"), ("r", "mx1", (x,), "mx", i, ("mx1", x))]
                    if "WG0 reads P1 before H1F" not in m:
                        ops += p1_read
                    last_sc = [("r", sc(st), (0,), "sc", i, ("F1", w, x))]
                    if "scales read after release" in m:
                        ops += [("use", i)] + (release[1:] if "release after S" not in m else []) + last_sc
                    else:
                        ops += last_sc + [("use", i)] + (release[1:] if "release after S" not in m else [])
                else:
                    if "no MX0" not in m:
                        ops.append(("sync", "MX0"))
                    ops.append(("r", "mx0", (x,), "mx", i, ("mx0", x)))
                    p1_write = [("w", p1_slab, x, "P1", i, frozenset({("P1", 0, x), ("P1", 1, x)}))]
                    if "P1 before own S ends" in m:
                        p1_write = []
                    if "P1 before MX0" in m:  # stored right after WG1's S, before its MX0 wait
                        k = next(j for j in range(len(ops) - 1, -1, -1) if ops[j][0] == "re")
                        ops[k + 1:k + 1] = p1_write
                        p1_write = []
                    ops += p1_write + [("w", "mx1", x, "mx", i, frozenset({("mx1", x)})), ("arrive", "H1F"),
                                       ("sync", "P0F")]
                    p0e = [("arrive", "P0E")] if i + 1 < T and "no P0E" not in m else []
                    p0_read = [("r", "P0", (x,), "P0", i, ("P0", x)), ("r", sc(st), (0,), "sc", i, ("F0", w, x))]
                    ops += (p0e + p0_read) if "P0E before P0 read" in m else (p0_read + p0e)
                    ops.append(("use", i))
                    back = [("r", p1_slab, (x,), "P1", i, ("P1", 1, x)), ("r", sc(st), (0,), "sc", i, ("F1", w, x))]
                    rel = release[1:] if "release after S" not in m else []
                    if "WG1 re-reads P1 after release" in m:
                        ops += [("use", i)] + rel + back
                    else:
                        ops += back + [("use", i)] + rel
            ops += [("w", f"sl{w}", x, "sl", 0, frozenset({("sl", 0, x), ("sl", 1, x)})), ("sync", "ALL"),
                    ("r", "sl0", (x,), "sl", 0, ("sl", w, x)), ("r", "sl1", (x,), "sl", 0, ("sl", w, x))]
            cons.append(ops)
    return prods + cons


class Hazard(Exception):
    """A region used out of order, a barrier generation completed wrongly, or one left open."""


# Reduction (Lipton's): an actor's step runs its ops from one boundary to the next at once. A step starts at a wait
# (mbarrier wait, bar.sync, the copies' cp.async wait) or at the end of a read in flight and ends after an op that
# lets another actor go on (an arrive at a named barrier or an mbarrier) or that puts a read in flight. Inside a
# step an actor only reads, stores and converts; no other actor is enabled by it, and an op of another actor that
# conflicts with the step inside it conflicts with it before or after it too (the checks only accumulate), so
# the hazards are found with that op moved out. MERGE[0] = False explores op by op: the same verdicts for the
# kernel (T <= 3) and for every broken variant (T <= 3) (`--op-by-op`, ~45 s of CPU).
MERGE = [True]
BOUNDARY = {"mwait", "sync", "re", "landed"}  # these start a step
STEP_END = {"rb", "arrive", "marrive"}  # these end one


def check_protocol(T, W=1, m=frozenset()):
    """Every interleaving for T tiles: (states, finished interleavings' end states, deadlocked states); raises
    Hazard."""
    progs = kds_programs(T, W, m)
    n = len(progs)
    cons_actors = list(range(NP, n))
    who = {a: (f"producer half {a}" if a < NP else f"warpgroup {(a - NP) // W}" +
               (f" warp-actor {(a - NP) % W}" if W > 1 else "")) for a in range(n)}
    need = {"PROD": NP, "MX0": len(cons_actors) // (2 if "MX0 over one warpgroup" in m else 1)}
    empties = len(cons_actors) // (2 if "empty counts one warpgroup" in m else 1)
    mb_count = {"full0": NP, "full1": NP, "empty0": empties, "empty1": empties}
    ALL_P = frozenset(range(NP))
    ALL_C = frozenset(range(len(cons_actors)))
    # state: pcs, waiting {actor: (bar, gen)}, named {bar: (arrived actors, gen)}, mbar {name: (count, phase)},
    # regions {(name, part): (content, tile, landed, in flight, pending readers)},
    # stage {s: (tile, released, landed, (actor, block) read, (actor, slab) stored)}
    def execute(a, pc, waiting, named, mbar, regions, stage):
        """Actor a's op at pc on the (mutable) state: "blocked" (an mbarrier phase not complete), "wait" (in
        bar.sync until its generation completes) or "done"; raises Hazard."""
        op = progs[a][pc]
        kind = op[0]
        def where():
            return f"T={T}: {who[a]} at {op[:2] if kind in ('gather', 'landed') else op}"

        if kind == "mwait":
            if (mbar.get(op[1], (0, 0))[1] & 1) == op[2]:
                return "blocked"
        elif kind == "marrive":
            cnt, phase = mbar.get(op[1], (0, 0))
            cnt += 1
            mbar[op[1]] = (0, phase + 1) if cnt == mb_count[op[1]] else (cnt, phase)
        elif kind in ("arrive", "sync"):
            arr, gen = named.get(op[1], (frozenset(), 0))
            if a in arr:
                raise Hazard(f"{where()}: arrives twice in one generation of {op[1]} (generations mixed)")
            arr = arr | {a}
            if len(arr) == need.get(op[1], len(cons_actors)):
                if kind == "arrive" and not any(v[0] == op[1] for v in waiting.values()):
                    raise Hazard(f"{where()}: generation of {op[1]} completed by arrivals alone")
                named[op[1]] = (frozenset(), gen + 1)
            else:
                named[op[1]] = (arr, gen)
                if kind == "sync":
                    waiting[a] = (op[1], gen)
                    return "wait"
        elif kind == "gather":
            i, writes = op[1], op[2]
            sst = i & 1
            tile, rel, landed, reads, stores = stage.get(sst, (None, frozenset(), frozenset(), frozenset(),
                                                               frozenset()))
            if tile != i:
                if tile is not None and rel != ALL_C:
                    raise Hazard(f"{where()}: stage {sst} gathered into before tile {tile} was released")
                if tile is not None and len(stores) != NP * 8:
                    raise Hazard(f"{where()}: stage {sst} gathered into while tile {tile} converts")
                stage[sst] = (i, frozenset(), frozenset(), frozenset(), frozenset())
            for name, part, content, readers in writes:
                c, t_, land, fly, pend = regions.get((name, part), (None, None, frozenset(), frozenset(),
                                                                    frozenset()))
                if (c, t_) != (content, i):
                    if fly:
                        raise Hazard(f"{where()}: {name}[{part}] copied over while {sorted(fly)} read it")
                    if pend:
                        raise Hazard(f"{where()}: {name}[{part}] ({c} of tile {t_}) copied over before "
                                     f"{sorted(pend)} read it")
                    regions[(name, part)] = (content, i, frozenset(), frozenset(), readers)
        elif kind == "landed":
            i = op[1]
            tile, rel, landed, reads, stores = stage[i & 1]
            if tile != i:
                raise Hazard(f"{where()}: copies land in stage {i & 1} holding tile {tile}")
            stage[i & 1] = (tile, rel, landed | {a}, reads, stores)
            for name, part, content, _ in op[2]:
                c, t_, land, fly, pend = regions[(name, part)]
                if (c, t_) != (content, i):
                    raise Hazard(f"{where()}: copies land in {name}[{part}], which now holds {c} of tile {t_}")
                regions[(name, part)] = (c, t_, land | {a}, fly, pend)
        elif kind == "cread":
            i, k = op[1], op[2]
            tile, rel, landed, reads, stores = stage[i & 1]
            if tile != i:
                raise Hazard(f"{where()}: reads block {k} from a stage holding tile {tile}")
            if landed != ALL_P:
                raise Hazard(f"{where()}: reads block {k} of tile {i} before every producer's copies landed")
            if any(k in OVERLAPS[j] for _, j in stores):
                raise Hazard(f"{where()}: reads block {k} of tile {i} after a slab store overwrote it")
            stage[i & 1] = (tile, rel, landed, reads | {(a, k)}, stores)
        elif kind == "cwrite":
            i, j = op[1], op[2]
            tile, rel, landed, reads, stores = stage[i & 1]
            if tile != i:
                raise Hazard(f"{where()}: stores slab {j} into a stage holding tile {tile}")
            for k in OVERLAPS[j]:
                if any((b, k) not in reads for b in range(NP)):
                    raise Hazard(f"{where()}: stores slab {j} of tile {i} before every producer read block {k}")
            stage[i & 1] = (tile, rel, landed, reads, stores | {(a, j)})
        elif kind == "use":
            i = op[1]
            tile, rel, landed, reads, stores = stage.get(i & 1, (None,) * 4 + (frozenset(),))
            if tile != i or len(stores) != NP * 8:
                raise Hazard(f"{where()}: stage {i & 1} holds tile {tile}, {len(stores)} of {NP * 8} slab "
                             f"parts converted")
        elif kind == "release":
            i = op[1]
            tile, rel, landed, reads, stores = stage[i & 1]
            if tile != i:
                raise Hazard(f"{where()}: releases a stage holding tile {tile}")
            stage[i & 1] = (tile, rel | {a - NP}, landed, reads, stores)
        elif kind == "w":
            _, name, part, content, i, readers = op
            c, t_, land, fly, pend = regions.get((name, part), (None, None, frozenset(), frozenset(),
                                                                frozenset()))
            if fly:
                raise Hazard(f"{where()}: {name}[{part}] stored while {sorted(fly)} read it")
            if pend:
                raise Hazard(f"{where()}: {name}[{part}] ({c} of tile {t_}) stored over before "
                             f"{sorted(pend)} read it")
            regions[(name, part)] = (content, i, ALL_P, frozenset(), readers)
        elif kind in ("r", "rb"):
            _, name, parts, content, i, label = op
            for part in parts:
                c, t_, land, fly, pend = regions.get((name, part), (None, None, frozenset(), frozenset(),
                                                                    frozenset()))
                if (c, t_) != (content, i):
                    raise Hazard(f"{where()}: {name}[{part}] holds {c} of tile {t_}")
                if land != ALL_P:
                    raise Hazard(f"{where()}: {name}[{part}] read before every producer's copies landed")
                regions[(name, part)] = (c, t_, land, fly | {label} if kind == "rb" else fly, pend - {label})
        elif kind == "re":
            _, name, parts, label = op
            for part in parts:
                c, t_, land, fly, pend = regions[(name, part)]
                regions[(name, part)] = (c, t_, land, fly - {label}, pend)
        else:
            raise AssertionError(f"unknown op {op}")
        return "done"

    init = (tuple([0] * n),) + (frozenset(),) * 5
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
            named = dict(st[2])
            if any(arr for arr, _ in named.values()):
                raise Hazard(f"T={T}: barrier left open at exit: {named}")
            continue
        moved = False
        base = [dict(x) for x in st[1:]]
        for a in range(n):
            if pcs[a] == len(progs[a]):
                continue
            pcs2 = list(pcs)
            cur = [d.copy() for d in base]
            waiting, named, mbar, regions, stage = cur
            if a in waiting:
                bid, gen = waiting[a]
                if named.get(bid, (frozenset(), 0))[1] == gen:
                    continue
                del waiting[a]
                pcs2[a] += 1
            else:
                status = execute(a, pcs2[a], waiting, named, mbar, regions, stage)
                if status == "blocked":
                    continue
                if status == "done":
                    pcs2[a] += 1
            # the actor's following ops up to the next boundary run in the same step (see MERGE)
            while MERGE[0] and a not in waiting and 0 < pcs2[a] < len(progs[a]) and \
                    progs[a][pcs2[a]][0] not in BOUNDARY and progs[a][pcs2[a] - 1][0] not in STEP_END:
                execute(a, pcs2[a], waiting, named, mbar, regions, stage)
                pcs2[a] += 1
            nxt = (tuple(pcs2),) + tuple(st[1 + k] if cur[k] == base[k] else frozenset(cur[k].items())
                                         for k in range(5))
            if nxt not in seen:
                stack.append(nxt)
            moved = True
        if not moved:
            deadlocks.append((pcs, {who[a]: progs[a][pcs[a]] for a in range(n) if pcs[a] < len(progs[a])}))
    return len(seen), finals, deadlocks


# The programs against the kernel's text: its consumer tile loop and producer loop specialized for kDs (`if
# constexpr (kDs)` blocks kept, their `else` and `if constexpr (!kDs)` dropped), scanned for the operations on
# shared memory and barriers in source order, must give the model's operations of a middle tile (T = 3, tile 1).


def _block_end(text, i):
    """Index just past the brace block opening at text[i] == '{'."""
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    raise AssertionError("unbalanced braces")


def specialize_kds(text):
    """The text with `if constexpr (kDs) {A} else {B}` -> A and `if constexpr (!kDs) X` dropped."""
    while True:
        mt = re.search(r"if constexpr \((!?)kDs\)\s*", text)
        if not mt:
            return text
        i = mt.end()
        if text[i] == "{":
            body_end = _block_end(text, i)
            body = text[i + 1:body_end - 1]
        else:
            body_end = text.index(";", i) + 1
            body = text[i:body_end]
        rest = text[body_end:]
        me = re.match(r"\s*else\s*", rest)
        other = ""
        if me:
            j = me.end()
            k = _block_end(rest, j) if rest[j] == "{" else rest.index(";", j) + 1
            other, rest = rest[j:k], rest[k:]
        text = text[:mt.start()] + (other if mt.group(1) else body) + rest


TOKENS = [  # (regex, token) in priority order
    (r"mbar_wait\(&full|begin_step\(", "mwait full"), (r"mbar_wait\(&empty", "mwait empty"), (r"MmaDs::s_rs\(", "S"),
    (r"add_scaled\(|scaled_fragments\(", "sc"), (r"flag\[", "flags"),
    (r"smx0\[row_lo[^\]]*\] =|store_row_pair\(smx0", "w mx0"), (r"smx0\[row_lo", "r mx0"),
    (r"smx1\[row_lo[^\]]*\] =|store_row_pair\(smx1", "w mx1"), (r"smx1\[row_lo", "r mx1"),
    (r"nb_(?:arrive|sync)<k\w+>\(kBar\w+\)", None), (r"store_p32\(sp", "w P0"),
    (r"store_p32\(sk \+ 8 \* kSlab", "w P1"), (r"load_p32\(sp", "r P0"),
    (r"load_p32\(sk \+ 8 \* kSlab", "r P1"), (r"pv_scaled\(", "pv"),
    (r"mbar_arrive\(&empty|release_stage\(", "release"),
    (r"gather_tile<", "gather"), (r"cp_async_wait_all\(", "landed"), (r"mbar_arrive\(&full", "marrive full"),
    (r"convert_in_place<", "convert"),
]
BARS = {"kBarMx0": "MX0", "kBarP0Full": "P0F", "kBarH1Full": "H1F", "kBarP0Empty": "P0E", "kBarProd": "PROD",
        "kBarAll": "ALL"}


def tokens(text):
    out = []
    rx = re.compile("|".join(f"({r})" for r, _ in TOKENS))
    for mt in rx.finditer(text):
        k = next(i for i, g in enumerate(mt.groups()) if g is not None)
        tok = TOKENS[k][1]
        if tok is None:
            kind, bar = re.match(r"nb_(\w+)<k\w+>\((kBar\w+)\)", mt.group(0)).groups()
            tok = f"{kind} {BARS[bar]}"
        if not out or out[-1] != tok:
            out.append(tok)
    return out


def model_tokens(ops):
    """The same tokens from a model program's ops."""
    out = []
    for j, op in enumerate(ops):
        k = op[0]
        tok = {"mwait": lambda: f"mwait {op[1].rstrip('01')}", "rb": lambda: "S", "arrive": lambda: f"arrive {op[1]}",
               "sync": lambda: f"sync {op[1]}", "release": lambda: "release", "gather": lambda: "gather",
               "landed": lambda: "landed",
               "marrive": lambda: "marrive full" if op[1].startswith("full") else None,
               "use": lambda: None if j + 1 < len(ops) and ops[j + 1][0] == "rb" else "pv",
               "cread": lambda: "convert", "cwrite": lambda: "convert"}.get(k, lambda: None)()
        if k in ("w", "r"):
            name = op[1].rstrip("01")
            tok = {("w", "mx"): f"w {op[1]}", ("r", "mx"): f"r {op[1]}", ("w", "rope"): "w P1",
                   ("r", "rope"): "r P1", ("w", "P"): "w P0", ("r", "P"): "r P0", ("r", "sc"): "sc",
                   ("r", "fl"): "flags"}.get((k, name.rstrip("0")), None)
        if tok and (not out or out[-1] != tok):
            out.append(tok)
    return out


def check_against_source(path=SRC):
    """Errors where the model's programs differ from the kernel's text."""
    text = re.sub(r"//[^\n]*", "", open(path).read())
    errors = []
    loop = text[text.index("for (int it = 0; it < ntiles; ++it) {"):text.index("l_lo += __shfl_xor_sync")]
    loop = specialize_kds(loop)
    i = loop.index("if (wg == 0) {")
    j = _block_end(loop, loop.index("{", i))
    k = _block_end(loop, loop.index("{", loop.index("else", j)))
    head, wg0, wg1, tail = loop[:i], loop[i:j], loop[j:k], loop[k:]
    progs = kds_programs(3)
    for w, body in ((0, wg0), (1, wg1)):
        ops = progs[NP + w]
        a = [n for n, op in enumerate(ops) if op[0] == "mwait"]
        want = model_tokens(ops[a[1]:a[2]])
        got = tokens(head) + tokens(body) + tokens(tail)
        got = [x for n, x in enumerate(got) if n == 0 or got[n - 1] != x]
        if got != want:
            errors.append(f"warpgroup {w}: kernel {got} != model {want}")
    prod = text[text.index("for (int i = 0; i < ntiles; ++i) {"):]
    prod = prod[:_block_end(prod, prod.index("{"))]
    ops = kds_programs(3)[0]
    third = model_tokens(ops[next(n for n, op in enumerate(ops) if op[0] == "mwait"):])  # tile 2: with its wait
    want = third[:third.index("sync PROD")] + ["sync PROD", "convert", "marrive full"]
    got = tokens(prod)
    if got != want or third[third.index("sync PROD"):] != ["sync PROD", "convert", "sync PROD", "convert",
                                                           "sync PROD", "convert", "marrive full"]:
        errors.append(f"producer loop: kernel {got}, model {third}")
    conv = text[text.index("void convert_in_place(uint8_t* stage, int u) {"):]
    conv = conv[:_block_end(conv, conv.index("{"))]
    ds = conv[conv.index("if constexpr (kDs) {"):]
    ds = ds[:_block_end(ds, ds.index("{"))]
    got = []
    for mt in re.finditer(r"(w\d\d) = load\((\d), (\d)\)|nb_sync|store_chunk<T>\(stage \+ kSlab \* (\d), "
                          r"r( \+ 32)?, q, (w\d\d)\)", ds):
        if mt.group(1):
            got.append(("ld", (int(mt.group(2)), int(mt.group(3)))))
        elif mt.group(0) == "nb_sync":
            got.append(("bar",))
        else:
            reg = mt.group(6)
            got.append(("st", int(mt.group(4)), 1 if mt.group(5) else 0, (int(reg[1]), int(reg[2]))))
    want = []
    for op in convert_ops(0)[16:]:
        want.append(op[:2] if op[0] == "ld" else op if op[0] == "bar" else ("st", op[1], op[2] // 32, op[4]))
    if got != want or not re.search(r"for \(int k = 0; k < 4; \+\+k\) \{\s*const uint4 w0 = load\(k, 0\), "
                                     r"w1 = load\(k, 1\);\s*store_chunk<T>\(stage \+ kSlab \* k, r, q, w0\);"
                                     r"\s*store_chunk<T>\(stage \+ kSlab \* k, r \+ 32, q, w1\);", conv):
        errors.append(f"convert_in_place<true>: kernel {got} != model {want}")
    return errors


def barrier_skeleton(ops):
    return [op[:2] for op in ops if op[0] in ("arrive", "sync", "mwait", "marrive")]


def check_skeleton(T):
    """The kDs programs' barrier operations are variant S's producer's and variant Z's consumers' (imported)."""
    ds = kds_programs(T)
    z.GROUPS[0] = 1
    _, zw0, zw1 = z.programs(T)
    want_p = [(k, n.replace("_0", "")) for k, n in barrier_skeleton(s.producer_program(T))]
    errors = []
    if barrier_skeleton(ds[0]) != want_p:
        errors.append("producer barrier skeleton differs from variant S's")
    for w, zw in ((0, zw0), (1, zw1)):
        want = [(k, n.replace("_0", "")) for k, n in barrier_skeleton(zw)]
        if barrier_skeleton(ds[NP + w]) != want:
            errors.append(f"warpgroup {w}'s barrier skeleton differs from variant Z's")
    return errors


MUTANTS = [
    "P1 before MX0",                   # WG1 stores P1 over the RoPE slab before WG0's S is known done
    "P1 before own S ends",            # WG1 stores P1 while its own S (RoPE steps) is in flight
    "no MX0",                          # no MX0 barrier at all
    "WG0 reads P1 before H1F",
    "WG1 re-reads P1 after release",
    "P1 in the other stage",           # P1 exchanged through the other stage's RoPE slab
    "scales read after release",       # WG0's last scale read (P1 times blocks 0-1's scales) after its release
    "one scale array",                 # the scales' stage index dropped
    "P0E before P0 read",
    "no P0E",
    "no PROD 1",
    "no PROD 2",
    "no PROD 3",
    "full before landed",
    "no empty wait",
    "release after S",
    "no ALL after Q",
    "MX0 over one warpgroup",          # bar.sync MX0 counting 128 threads
    "empty counts one warpgroup",      # empty[s] initialized with 4 arrivals
]
WARP_MUTANTS = [("P1 before MX0", 1), ("MX0 over one warpgroup", 1), ("empty counts one warpgroup", 3)]


def check_mutants(W=1, tiles=4, names=MUTANTS):
    """Each broken variant (a name, or (name, T): that T only) must raise a hazard or deadlock for some T."""
    caught = 0
    for name in names:
        name, tiles_of = (name, range(1, tiles + 1)) if isinstance(name, str) else (name[0], [name[1]])
        found = None
        for T in tiles_of:
            try:
                _, _, dl = check_protocol(T, W, frozenset({name}))
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

BYTE_MUTANTS = [
    ("codes at the 576 layout's offset (kCodeOff)", {"code_off": C["kCodeOff"]}),
    ("RoPE copied unswizzled into slab 8", {"rope_swizzle": False}),
    ("row b's scales taken from row a", {"scale_row_b_from_a": True}),
    ("block 5 read after the second PROD barrier", {"block5_late": True}),
    ("no second PROD barrier (slabs 4-5 with blocks 4-5's reads)", {"prod2": False}),
    ("no third PROD barrier (slab 7 with blocks 6-7's reads)", {"prod3": False}),
    ("rows r + 32 at half a block (16 rows) on", {"half_step": 16 * 64}),
]


def main(argv) -> int:
    if "--op-by-op" in argv:  # the reduction's check: no steps, W = 1, T <= 3
        MERGE[0] = False
        bad = 0
        for T in range(1, 4):
            nst, finals, dl = check_protocol(T)
            print(f"  op by op, T={T}: {nst} states, {finals} final, {len(dl)} deadlocked")
            bad += bool(dl) + (finals == 0)
        bad += check_mutants(1, 3) != len(MUTANTS)
        print("ALL PASS" if bad == 0 else f"FAIL ({bad})")
        return 1 if bad else 0
    bad = 0
    errors, end = check_regions()
    print(f"constants from the kernel: kCodeOffDs {CODE_OFF}, kOffScales {OFF_SCALES}, kDsScales {DS_SCALES}, "
          f"kDsRope {DS_ROPE}, kSmemBytes {C['kSmemBytes']}; regions: "
          f"{'disjoint, end at ' + str(end) if not errors else 'FAIL: ' + '; '.join(errors)}")
    bad += bool(errors)
    print(f"overlaps (slab j: code blocks it covers): {OVERLAPS}")
    errors = check_producer_bytes()
    print(f"producer bytes (gather + in-place conversion, both stages, zero-filled rows): "
          f"{'OK' if not errors else 'FAIL: ' + '; '.join(errors[:4])}")
    bad += bool(errors)
    print("broken producers (must all be caught):")
    for name, kw in BYTE_MUTANTS:
        errors = check_producer_bytes(**kw)
        print(f"  '{name}': {'caught: ' + errors[0] if errors else 'NOT caught'}")
        bad += not errors
    errors = check_consumer_bytes()
    print(f"consumer addressing (S blocks / scales, Q RoPE fragments, P exchange, V blocks): "
          f"{'OK' if not errors else 'FAIL: ' + '; '.join(errors[:4])}")
    bad += bool(errors)
    rows = p1_rows_by_warp()  # the protocol's P1 parts: any warp's store meets both warpgroups' S rows
    meet = all(min(r) < 32 <= max(r) for r in rows.values())
    print(f"slab-8 rows each warp's P1 stores: {rows[0][:4]}.. {rows[0][-4:]} (warp x: + 4x); every warp's part meets "
          f"WG0's S rows 0-31 and WG1's 32-63: {'OK' if meet else 'FAIL'}")
    bad += not meet
    errors = check_against_source()
    print(f"programs against the kernel's text (kDs-specialized tile loops, convert_in_place<true>): "
          f"{'OK' if not errors else 'FAIL: ' + '; '.join(errors)}")
    bad += bool(errors)
    errors = [f"T={T}: {e}" for T in range(1, 5) for e in check_skeleton(T)]
    print(f"barrier skeleton (producer = variant S's, consumers = variant Z's, T = 1..4): "
          f"{'OK' if not errors else 'FAIL: ' + '; '.join(errors)}")
    bad += bool(errors)
    for W, tiles in ((1, 4), (2, 3)):
        print(f"protocol ({NP} producer actors + {W} actor(s) per consumer warpgroup, every interleaving):")
        for T in range(1, tiles + 1):
            try:
                nst, finals, dl = check_protocol(T, W)
            except (Hazard, AssertionError) as e:
                print(f"  T={T}: HAZARD {e}")
                bad += 1
                continue
            print(f"  T={T}: {nst} states, {finals} final, {len(dl)} deadlocked")
            bad += bool(dl) + (finals == 0)
    print("broken protocols (must all be caught; T <= 4, one actor per warpgroup):")
    bad += check_mutants() != len(MUTANTS)
    print("broken protocols with two actors per warpgroup (at the T given):")
    bad += check_mutants(2, 3, WARP_MUTANTS) != len(WARP_MUTANTS)
    print("ALL PASS" if bad == 0 else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
