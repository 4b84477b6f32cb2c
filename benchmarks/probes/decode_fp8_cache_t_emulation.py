"""CPU check of decode_t_kernel's ring protocol (csrc/mla_decode_wgmma.cu: the keys-as-M FP8-cache kernel) with
the bulk-copy producer: every interleaving of the producer threads, their in-flight copies and the two consumer
warpgroups, explored depth-first with memoized states, for 1..7 steps over the 4-stage ring.

Model. mbarrier = (phase, pending arrivals, tx count): arrive decrements pending, arrive.expect_tx(n) also adds n to
tx, a copy's landing (complete_tx) subtracts its bytes; the phase completes when pending and tx are both 0 (then
pending = count, tx = 0). A parity wait passes once the phase of that parity completed ((phase & 1) != parity).
full[s]: count 2 (two producer threads stand for the 128: A, lane 0 of a warp; B, a lane with or without a row);
empty[s]: count 1 (a consumer warpgroup: its 4 warps arrive after their last loads, one actor here). A stage holds
two rows (row 0: A's, row 1: B's, or both A's as one run). Each step has a mode, as produce_codes_t chooses it:
"run" (A: arrive.expect_tx(2 rows), one copy of both; B: arrive), "rows" (A and B: arrive.expect_tx(1 row), a copy
each), "tail" (A: a row's copy; B: zero stores, then arrive), "bytes" (A and B: generic stores, then arrive).
Producer thread program per step i (stage i % 4): wait empty[s] (parity ((i - 4) / 4) & 1) from step 4 on, its
step's operations, then the next step. Copies land at any later point. Consumer c takes steps c, c + 2, ...: wait
full[s] (parity (i / 4) & 1), read the stage twice (S^T, then P V: both must find step i's rows: a write between
or before them is a hazard), arrive on empty[s].

Checked: no deadlock, every read finds its step's rows, all work finished; six broken protocols must be caught
(a check that a mistake would show). Not modelled: the proxy fences (a zero-stored row later rewritten by a bulk
copy of the same thread: fence.proxy.async after the stores), the data path (decode_fp8_cache_t_check.py).

    python3 benchmarks/probes/decode_fp8_cache_t_emulation.py
"""
from __future__ import annotations

import sys
from functools import lru_cache

STAGES = 4
MODES = ("run", "rows", "tail", "bytes")


def producer_ops(mode: str, who: str, broken: str) -> list:
    """One producer thread's operations for a step (after its empty wait)."""
    if mode == "run":
        if who == "A":
            return [("copy", (0, 1), 2)] if broken == "copy_no_expect" else [("expect", 2), ("copy", (0, 1), 2)]
        return [("arrive",)]
    if mode == "rows" or (mode == "tail" and who == "A"):
        row = 0 if who == "A" else 1
        if broken == "expect_short" and who == "A":
            return [("expect", 0), ("copy", (row,), 1)]
        return [("copy", (row,), 1)] if broken == "copy_no_expect" else [("expect", 1), ("copy", (row,), 1)]
    row = 0 if who == "A" else 1  # tail's B, bytes: generic stores, then arrive
    if broken == "arrive_before_store":
        return [("arrive",), ("store", row)]
    return [("store", row), ("arrive",)]


def explore(steps: int, modes: tuple, broken: str = "") -> str:
    """'' if every interleaving finishes with every read right, else what went wrong first."""

    def init():
        bars = tuple((0, 2, 0) for _ in range(STAGES)) + tuple((0, 1, 0) for _ in range(STAGES))
        stage = tuple((None, None) for _ in range(STAGES))
        # producer thread: (step, pc within the step's ops; -1 = before the empty wait)
        return bars, stage, ((0, -1), (0, -1)), (), ((0, 0), (1, 0))  # consumers: (step, pc)

    def bar_op(bars, k, arrive=0, tx=0):
        phase, pend, cnt = bars[k]
        pend -= arrive
        cnt += tx
        if pend == 0 and cnt == 0:
            phase, pend, cnt = phase + 1, (2 if k < STAGES else 1), 0
        return bars[:k] + ((phase, pend, cnt),) + bars[k + 1:]

    def passed(bars, k, parity):
        return (bars[k][0] & 1) != parity

    def write(stage, s, rows, value):
        r = list(stage[s])
        for x in rows:
            r[x] = value
        return stage[:s] + (tuple(r),) + stage[s + 1:]

    @lru_cache(maxsize=None)
    def go(state) -> str:
        bars, stage, prod, copies, cons = state
        moves = []
        for t, (i, pc) in enumerate(prod):
            if i >= steps:
                continue
            s, who = i % STAGES, "AB"[t]
            ops = producer_ops(modes[i], who, broken)
            if pc == -1:
                if i < STAGES or broken == "no_empty_wait" or passed(bars, STAGES + s, ((i - STAGES) // STAGES) & 1):
                    moves.append((bars, stage, prod[:t] + ((i, 0),) + prod[t + 1:], copies, cons))
                continue
            op = ops[pc]
            nxt = (i, pc + 1) if pc + 1 < len(ops) else (i + 1, -1)
            p2 = prod[:t] + (nxt,) + prod[t + 1:]
            if op[0] == "expect":
                moves.append((bar_op(bars, s, arrive=1, tx=op[1]), stage, p2, copies, cons))
            elif op[0] == "arrive":
                moves.append((bar_op(bars, s, arrive=1), stage, p2, copies, cons))
            elif op[0] == "store":
                moves.append((bars, write(stage, s, (op[1],), i), p2, copies, cons))
            else:  # copy issued: in flight until it lands; a thread whose expect was elided arrives with the issue
                b2 = bar_op(bars, s, arrive=1) if broken == "copy_no_expect" else bars
                moves.append((b2, stage, p2, tuple(sorted(copies + ((s, op[1], op[2], i),))), cons))
        for j, (s, rows, n, i) in enumerate(copies):
            moves.append((bar_op(bars, s, tx=-n), write(stage, s, rows, i), prod, copies[:j] + copies[j + 1:], cons))
        for c, (i, pc) in enumerate(cons):
            if i >= steps:
                continue
            s = i % STAGES
            nxt = (i, pc + 1) if pc < 3 else (i + 2, 0)
            c2 = cons[:c] + (nxt,) + cons[c + 1:]
            parity = ((i // STAGES) & 1) ^ (1 if broken == "wrong_parity" else 0)
            if pc == 0:
                if passed(bars, s, parity):
                    moves.append((bars, stage, prod, copies, c2))
            elif pc in (1, 2):
                if stage[s] != (i, i):
                    return f"consumer {c} read {stage[s]} in stage {s} for step {i}"
                early = pc == 1 and broken == "early_release"  # released between the two reads
                moves.append((bar_op(bars, STAGES + s, arrive=1) if early else bars, stage, prod, copies, c2))
            else:  # the release after the last loads (already done when broken early)
                b2 = bars if broken == "early_release" else bar_op(bars, STAGES + s, arrive=1)
                moves.append((b2, stage, prod, copies, c2))
        if not moves:
            done = all(i >= steps for i, _ in prod) and not copies and all(i >= steps for i, _ in cons)
            return "" if done else f"deadlock: producer {prod}, copies {copies}, consumers {cons}, barriers {bars}"
        for m in moves:
            err = go(m)
            if err:
                return err
        return ""

    return go(init())


def mode_sets(steps: int) -> list[tuple]:
    """Every step one mode; the modes in turn; a tail last (the kernel's order: runs, then the split's end)."""
    sets = [tuple([m] * steps) for m in MODES]
    sets.append(tuple(MODES[i % 4] for i in range(steps)))
    sets.append(tuple(["run"] * (steps - 1) + ["tail"]))
    return sets


def main() -> int:
    ok = True
    for steps in range(1, 8):
        for modes in mode_sets(steps):
            err = explore(steps, modes)
            if err:
                ok = False
                print(f"FAIL {steps} steps {modes}: {err}")
    print(("OK  " if ok else "FAIL") + " the protocol, 1..7 steps x 6 mode sequences, every interleaving")
    broken = {
        "copy_no_expect": "the issuing lane arrives without expect_tx (the phase completes before its copy lands)",
        "expect_short": "a row's copy not expected (expect_tx 0)",
        "no_empty_wait": "the producer refills a stage without waiting on empty",
        "wrong_parity": "the consumers wait on the other parity of full",
        "early_release": "a consumer releases its stage after S^T, before P V's loads",
        "arrive_before_store": "a zero-filling lane arrives before its stores",
    }
    for name, what in broken.items():
        caught = any(explore(steps, modes, name) for steps in range(1, 7) for modes in mode_sets(steps))
        ok &= caught
        print(("OK  " if caught else "FAIL") + f" broken protocol caught: {what}")
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
