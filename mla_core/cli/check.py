"""Cross-backend checks: every available backend against the reference on small random problems.

Used by ``mla-core check`` and ``mla-core demo``; the same comparisons the tests make, packaged for users
who want to see that a backend computes the reference's function on their machine.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from .. import inputs, ops, specs
from ..accuracy import REFERENCE, compare, output_dtype, tolerance
from ..backend import result_checks
from ..plugins import backends, get_backend
from .table import table


@dataclass
class Case:
    """One named check: an op, its problem's name, and a function that runs it on a backend."""

    op: str
    name: str
    run: Callable[[str], tuple[torch.Tensor, ...]]
    problem: object


def cases(device: str) -> list[Case]:
    """The small problems ``mla-core check`` runs on ``device``."""
    out = []
    for recipe in (None, "fp8", "nvfp4"):
        kw = inputs.decode_inputs([0, 1, 17, 100], heads=16, page_size=16, device=device, seed=1)
        q = {"k_qdq": recipe, "v_qdq": recipe, "p_qdq": recipe}
        out.append(Case("decode", f"decode bf16 heads=16 lens=[0,1,17,100] page=16 kvp={recipe or 'none'}",
                        lambda b, kw=kw, q=q: ops.mla_decode(**kw, **q, num_kv_splits=8, backend=b),
                        specs.validate_decode(**kw, page_size=None, num_kv_splits=8, **q, k_qdq_amax=None,
                                              v_qdq_amax=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)[0]))
        pk = inputs.prefill_inputs([0, 33, 70], [5, 40, 70], heads=4, qk_dim=192, v_dim=128, device=device, seed=2)
        pq = {"q_quant": recipe, "k_quant": recipe, "p_quant": recipe, "v_quant": recipe}
        out.append(Case("prefill", f"prefill bf16 causal heads=4 192/128 q=[0,33,70] k=[5,40,70] qkvp={recipe or 'none'}",
                        lambda b, pk=pk, pq=pq: ops.mla_prefill(**pk, causal=True, return_lse=True, **pq, backend=b),
                        _prefill_problem(pk, pq)))
    mk = inputs.merge_inputs(37, heads=4, head_dim=128, device=device, seed=3)
    out.append(Case("merge", "merge bf16 tokens=37 heads=4 dim=128",
                    lambda b: ops.merge_attn_states(**mk, backend=b), specs.validate_merge(**mk, output=None, output_lse=None)[0]))
    rk = inputs.rope_inputs(19, heads=4, device=device, seed=4)
    for neox in (True, False):
        out.append(Case("rope_quantize_fp8", f"rope+fp8 bf16 nnz=19 heads=4 neox={neox}",
                        lambda b, neox=neox: ops.mla_rope_quantize_fp8(**rk, is_neox=neox, backend=b),
                        _rope_problem(rk, neox)))
    sk = inputs.sparse_decode_inputs(3, q_len=2, heads=16, top_k=128, device=device, seed=5)
    out.append(Case("sparse_decode", "sparse fp8 batch=3 q_len=2 heads=16 top_k=128",
                    lambda b: ops.sparse_mla_fp8_decode(**sk, return_lse=True, backend=b), _sparse_problem(sk)))
    return out


def _prefill_problem(pk, pq):
    return specs.validate_prefill(**pk, softmax_scale=None, causal=True, return_lse=True, **pq, q_amax=None,
                                  k_amax=None, p_amax=1.0, v_amax=None, sparsity_n=0, sparsity_m=4,
                                  dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64)[0]


def _rope_problem(rk, neox):
    return specs.validate_rope_quantize(**rk, is_neox=neox, quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0,
                                        q_rope_out=None, k_rope_out=None, q_nope_out=None, k_nope_out=None)[0]


def _sparse_problem(sk):
    return specs.validate_sparse_decode(sk["query"], sk["kv_cache"], 128, 512, 64, sk["block_tables"], sk["seq_lens"],
                                        sk["sparse_mla_top_k"], None, sk["bmm1_scale"], sk["bmm2_scale"], None, True,
                                        None)[0]


def check(device: str, only: list[str] | None = None) -> list[dict]:
    """Run :func:`cases` on every available non-reference backend; one row per (backend, case).

    ``status`` is pass / FAIL / skip; ``error`` the relative L2 error against the reference (None when not
    run); ``reason`` the tolerance, the failure, or why the backend cannot run the case here.
    """
    rows = []
    names = only or [n for n in sorted(backends()) if n != REFERENCE]
    chosen = [get_backend(name) for name in names]  # unknown names fail before any work
    all_cases = cases(device)
    expected: dict[str, tuple] = {}  # the reference's results, computed for the cases some backend runs
    for backend in chosen:
        name = backend.name
        for case in all_cases:
            why = backend.why_not(case.problem)
            row = {"backend": name, "op": case.op, "case": case.name}
            if why:
                rows.append({**row, "status": "skip", "error": None, "reason": "; ".join(why)})
                continue
            try:
                if case.name not in expected:
                    with result_checks():
                        expected[case.name] = case.run(REFERENCE)
                with result_checks():
                    result = case.run(name)
                err = compare(result, expected[case.name])
            except Exception as exc:  # a crashing backend is a failed check, reported, not fatal
                rows.append({**row, "status": "FAIL", "error": None, "reason": f"{type(exc).__name__}: {exc}"})
                continue
            tol = tolerance(output_dtype(expected[case.name]))
            rows.append({**row, "status": "pass" if err < tol else "FAIL", "error": err, "reason": f"tolerance {tol:g}"})
    return rows


def summary(rows: list[dict]) -> dict:
    """Counts of checked / passed / failed / skipped rows, and the skip reasons with how often each occurred."""
    skipped = Counter(f"{r['backend']}: {r['reason']}" for r in rows if r["status"] == "skip")
    return {"checked": sum(r["status"] != "skip" for r in rows), "passed": sum(r["status"] == "pass" for r in rows),
            "failed": sum(r["status"] == "FAIL" for r in rows), "skipped": sum(skipped.values()),
            "skip_reasons": dict(skipped.most_common())}


def hints(rows: list[dict], device: str) -> list[str]:
    """How to check more on this machine: the Triton interpreter for kernels skipped on a CPU, a GPU otherwise."""
    out = []
    skipped_for_device = sorted({r["backend"] for r in rows if r["status"] == "skip" and "device=" in r["reason"]})
    if device == "cpu" and "triton" in skipped_for_device and os.environ.get("TRITON_INTERPRET") != "1":
        out.append("check the Triton kernels on this CPU under the interpreter (slow, small shapes): "
                   "TRITON_INTERPRET=1 mla-core check --backend triton --device cpu")
    others = [b for b in skipped_for_device if b != "triton" or device != "cpu"]
    if others or any(r["status"] == "skip" and "no CUDA device" in r["reason"] for r in rows):
        out.append("backends that need a GPU are checked on one: mla-core check --device cuda")
    return out


def cmd_check(args) -> int:
    from . import resolve_device
    device = resolve_device(args.device)
    rows = check(device, args.backend or None)
    counts = summary(rows)
    if args.json:
        print(json.dumps({"device": device, "summary": counts, "hints": hints(rows, device), "results": rows},
                         indent=2))
        return 1 if counts["failed"] else 0
    print(f"mla-core check on {device}: every backend against the reference backend (relative L2 error)")
    if rows:
        print(table([[r["backend"], r["case"], r["status"], "-" if r["error"] is None else f"{r['error']:.2e}",
                      r["reason"] or ""] for r in rows], ["backend", "case", "status", "rel L2 error", "note"]))
    else:
        print("no backend besides the reference is loaded")
    print(f"\nchecked {counts['checked']}: {counts['passed']} passed, {counts['failed']} failed; "
          f"skipped {counts['skipped']}" + (":" if counts["skipped"] else ""))
    for reason, n in counts["skip_reasons"].items():
        print(f"  {n} x {reason}")
    for hint in hints(rows, device):
        print(f"to check more: {hint}")
    if counts["failed"]:
        print("FAILED: a backend disagrees with the reference (or crashed) on the cases marked FAIL")
    return 1 if counts["failed"] else 0


def add_parser(subparsers) -> None:
    """Add ``check`` to the ``mla-core`` subparsers."""
    p = subparsers.add_parser(
        "check", help="run every backend against the reference on small random problems; summary and exit code",
        description="Runs each backend on small random problems of every op it supports (boundary lengths, "
                    "empty rows, every quant recipe) and compares with the reference backend (relative L2; fp32 "
                    "< 1e-5, else < 1e-2). Prints each case, then a summary: checked / failed / skipped and why, "
                    "and how to check more on this machine. Exit code 1 when any check fails.")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where to run (default: cuda when available, else cpu)")
    p.add_argument("--backend", action="append", help="check only this backend (repeatable)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_check)
