"""A conformance suite for backend plugins: :func:`check_backend` runs everything a backend declares against the
reference backend, the way mla_core's own tests judge its built-in backends.

A plugin's test suite needs one test::

    from mla_core.testing import check_backend

    def test_conformance():
        check_backend("mybackend")          # raises ConformanceError (an AssertionError) listing every failure

What it checks, for the device the backend runs on here (``device=`` to choose; a backend that cannot run on
this machine is skipped, with ``pytest.skip`` under pytest):

* declarations: every op in ``capabilities`` is an mla_core op with a method of that name; every ``limits`` key
  is a :class:`~mla_core.problem.Problem` parameter of that op and every feature a feature the op can need (a
  typo such as ``"dtypes"`` would otherwise leave the op unrestricted);
* per declared op, awkward calls (:func:`cases`): lengths on tile boundaries
  (:mod:`mla_core.testing.shapes`), 0-length requests and sequences, rows with no key (LSE -inf and output 0),
  -inf / +inf input LSEs, every dtype and quant recipe, GQA, N:M sparsity, with and without LSE; unreachable
  cache pages hold NaN and caller-given output buffers are NaN-filled before the call;
* ``why_not`` honesty: a call it accepts must run and match the reference (relative L2 below the tolerance of
  :func:`mla_core.accuracy.tolerance`, no NaN, -inf where the reference has -inf); a call it refuses must come
  with a reason; an op that refuses every call the suite builds is a failure (nothing was tested);
* ``configs()``: a non-empty list of JSON-serializable dicts, and every config (up to ``max_configs``) gives the
  reference's numerics;
* outputs: the tuple the reference backend's method returns (None where it returns None: see
  :class:`mla_core.Backend`), its shapes and dtypes,
  contiguous, on the input's device, and caller-given buffers written in place and returned.

:func:`check_backend` returns a :class:`ConformanceReport` (``str()`` prints a table) or raises.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .. import inputs
from ..accuracy import REFERENCE, compare, tolerance
from ..backend import Backend
from ..explain import validate
from ..plugins import get_backend
from ..problem import OPS
from .shapes import boundary_lengths, causal_boundary_pairs

COVERED_OPS = ("decode", "prefill", "merge", "rope_quantize_fp8", "sparse_decode")
"""Ops the suite builds calls for (a declared op outside these is reported as not covered, not failed)."""

OUTPUT_BUFFERS: dict[str, dict[str, int]] = {
    "decode": {},
    "prefill": {},
    "merge": {"output": 0, "output_lse": 1},
    "rope_quantize_fp8": {"q_rope_out": 0, "k_rope_out": 1, "q_nope_out": 2, "k_nope_out": 3},
    "sparse_decode": {"out": 0, "lse": 1},
}
"""Per op, the call object's caller-given output buffers and the position of the result they must be."""

FEATURES: dict[str, str] = {
    "lse": "the call asks for the log-sum-exp (return_lse=True, or an lse buffer); without it a backend may skip it",
    "fp32_q": "decode: a float32 query (a caller-quantized carrier) over a bf16/fp16 cache",
    "kv_qdq_fp8_cache": "decode: k_qdq / v_qdq over an FP8 cache (its dequantized values re-quantized on read)",
    "gqa": "prefill: fewer key/value heads than query heads (GQA / MQA)",
    "nm_sparsity": "prefill: N:M score sparsity along keys (sparsity_n < sparsity_m)",
}
"""Every feature name a call of a covered op can need (``Problem.features``), and when it is needed."""

_NAN = float("nan")


class ConformanceError(AssertionError):
    """A backend failed conformance; the message is the report's failures."""


@dataclass(frozen=True)
class Case:
    """One call of an op: ``build(device)`` returns fresh keyword arguments of the public op (buffers NaN-filled)."""

    op: str
    name: str
    build: Callable[[str], dict[str, Any]]


@dataclass
class CaseResult:
    """The outcome of one case (and config): ``status`` pass / FAIL / refused."""

    op: str
    case: str
    status: str
    detail: str = ""
    config: dict[str, Any] | None = None


@dataclass
class ConformanceReport:
    """Everything :func:`check_backend` found. ``ok``: no failure; ``skipped``: why nothing ran (or None)."""

    backend: str
    device: str
    results: list[CaseResult] = field(default_factory=list)
    declaration_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def failures(self) -> list[str]:
        out = list(self.declaration_errors)
        out += [f"{r.op} [{r.case}]" + (f" config {json.dumps(r.config, sort_keys=True)}" if r.config else "")
                + f": {r.detail}" for r in self.results if r.status == "FAIL"]
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in ("pass", "FAIL", "refused")}

    def __str__(self) -> str:
        if self.skipped:
            return f"conformance of {self.backend!r}: skipped ({self.skipped})"
        c = self.counts()
        lines = [f"conformance of {self.backend!r} on {self.device} against {REFERENCE!r}: {c['pass']} passed, "
                 f"{len(self.failures)} failed, {c['refused']} refused (with reasons)"]
        lines += [f"  FAIL {f}" for f in self.failures]
        refused: dict[str, int] = {}
        for r in self.results:
            if r.status == "refused":
                refused[f"{r.op}: {r.detail}"] = refused.get(f"{r.op}: {r.detail}", 0) + 1
        lines += [f"  refused {n} x {why}" for why, n in refused.items()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# the calls


def _nan(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, _NAN, dtype=dtype, device=device)


def _decode_cases() -> list[Case]:
    lengths = boundary_lengths([32, 16], limit=70)  # the 32-key P tile and the 16-token page
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for recipe in ((None, "fp8", "nvfp4") if dtype == torch.bfloat16 else (None,)):
            name = f"{str(dtype)[6:]} lens={lengths} page=16 splits=4 kvp={recipe or 'none'}"
            out.append(Case("decode", name, lambda d, dt=dtype, r=recipe: dict(
                inputs.decode_inputs(lengths, heads=16, page_size=16, dtype=dt, device=d, seed=11),
                num_kv_splits=4, k_qdq=r, v_qdq=r, p_qdq=r)))
    out.append(Case("decode", "bfloat16 without lse, 32 splits", lambda d: dict(
        inputs.decode_inputs([0, 1, 33, 64], heads=8, page_size=32, device=d, seed=12), return_lse=False)))
    out.append(Case("decode", "fp32 query over a bfloat16 cache (fp32_q)", lambda d: dict(
        inputs.decode_inputs([17, 65], heads=4, page_size=16, q_dtype=torch.float32, device=d, seed=13),
        num_kv_splits=2)))
    out.append(Case("decode", "FP8 cache (float8_e4m3fn + kv_scale), P fp8", lambda d: dict(
        _fp8_cache(inputs.decode_inputs([17, 33, 64], heads=8, page_size=16, device=d, seed=14)),
        num_kv_splits=2, p_qdq="fp8")))
    out.append(Case("decode", "k_qdq / v_qdq over an FP8 cache (kv_qdq_fp8_cache)", lambda d: dict(
        _fp8_cache(inputs.decode_inputs([17, 33], heads=4, page_size=16, device=d, seed=15)),
        num_kv_splits=2, k_qdq="fp8", v_qdq="fp8")))
    return out


def _fp8_cache(kw: dict, kv_scale: float = 0.01) -> dict:
    """``kw``'s bf16 cache as the E4M3 codes of ``value / kv_scale`` (NaN slots stay NaN codes), with its scale."""
    codes = (kw["latent_cache"].float() / kv_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return dict(kw, latent_cache=codes, kv_scale=kv_scale)


def _prefill_pairs() -> list[tuple[int, int]]:
    pairs = list(causal_boundary_pairs(64, 64, query_tiles=1, limit=200))[:2]
    return pairs + [(0, 5), (1, 1), (5, 0), (63, 65)]


def _prefill(d, dtype=torch.bfloat16, heads=4, kv_heads=None, seed=21, **kw):
    q_lens, k_lens = zip(*_prefill_pairs())
    return dict(inputs.prefill_inputs(list(q_lens), list(k_lens), heads=heads, kv_heads=kv_heads, dtype=dtype,
                                      device=d, seed=seed), return_lse=True, **kw)


def _prefill_cases() -> list[Case]:
    pairs = _prefill_pairs()
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        out.append(Case("prefill", f"{str(dtype)[6:]} causal (q, k) lengths {pairs}",
                        lambda d, dt=dtype: _prefill(d, dt)))
    for recipe in ("fp8", "nvfp4"):
        out.append(Case("prefill", f"bfloat16 causal q/k/p/v {recipe}", lambda d, r=recipe: _prefill(
            d, q_quant=r, k_quant=r, p_quant=r, v_quant=r)))
    out.append(Case("prefill", "bfloat16 non-causal (a context chunk)", lambda d: _prefill(d, causal=False)))
    out.append(Case("prefill", "bfloat16 causal without lse", lambda d: {**_prefill(d), "return_lse": False}))
    out.append(Case("prefill", "bfloat16 GQA 4 query heads over 1 kv head", lambda d: _prefill(d, kv_heads=1)))
    out.append(Case("prefill", "bfloat16 2:4 sparsity", lambda d: _prefill(d, sparsity_n=2, sparsity_m=4,
                                                                            dense_recent_tokens=8)))
    return out


def _merge(d, tokens, dtype, buffers, out_dtype=None, seed=31):
    kw = inputs.merge_inputs(tokens, heads=4, head_dim=64, dtype=dtype, device=d, seed=seed)
    if tokens > 2:  # an empty state written as +inf, as FlashAttention / vLLM report it
        kw["suffix_lse"][1, 1] = float("inf")
    if buffers:
        kw["output"] = _nan((tokens, 4, 64), out_dtype or dtype, d)
        kw["output_lse"] = _nan((4, tokens), torch.float32, d)
    return kw


def _merge_cases() -> list[Case]:
    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens in boundary_lengths([16], limit=40, extra=[0])[1:]:
            out.append(Case("merge", f"{str(dtype)[6:]} tokens={tokens} -inf/+inf rows",
                            lambda d, t=tokens, dt=dtype: _merge(d, t, dt, False)))
        out.append(Case("merge", f"{str(dtype)[6:]} tokens=33 into NaN-filled output buffers",
                        lambda d, dt=dtype: _merge(d, 33, dt, True)))
    out.append(Case("merge", "bfloat16 inputs into a float32 output buffer",
                    lambda d: _merge(d, 17, torch.bfloat16, True, out_dtype=torch.float32)))
    out.append(Case("merge", "bfloat16 tokens=0", lambda d: _merge(d, 0, torch.bfloat16, False)))
    return out


def _rope(d, nnz, neox, dtype=torch.bfloat16, buffers=False, cos_dtype=torch.float32, seed=41):
    kw = dict(inputs.rope_inputs(nnz, heads=4, dtype=dtype, cos_dtype=cos_dtype, max_pos=256, device=d, seed=seed),
              is_neox=neox)
    if buffers:  # E4M3FN has a NaN (0x7f): an element a kernel does not write stays NaN
        for name in ("q_rope", "k_rope", "q_nope", "k_nope"):
            kw[f"{name}_out"] = _nan(kw[name].shape, torch.float8_e4m3fn, d)
    return kw


def _rope_cases() -> list[Case]:
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        for neox in (True, False):
            for nnz in (1, 15, 17):
                out.append(Case("rope_quantize_fp8", f"{str(dtype)[6:]} nnz={nnz} neox={neox}",
                                lambda d, n=nnz, x=neox, dt=dtype: _rope(d, n, x, dt)))
    out.append(Case("rope_quantize_fp8", "bfloat16 nnz=33 into NaN-filled fp8 buffers",
                    lambda d: _rope(d, 33, True, buffers=True)))
    out.append(Case("rope_quantize_fp8", "bfloat16 nnz=9 bfloat16 cos/sin table",
                    lambda d: _rope(d, 9, True, cos_dtype=torch.bfloat16)))
    return out


def _sparse(d, q_len, buffers, seq_lens=(128, 0, 65, 64), seed=51, heads=16, ds_mla=False):
    kw = inputs.sparse_decode_inputs(len(seq_lens), q_len=q_len, heads=heads, top_k=128, seq_lens=list(seq_lens),
                                     device=d, seed=seed)
    kw["return_lse"] = True
    if ds_mla:  # FlashMLA's 656-byte rows (the same values, per-128 scales) and a bf16 query
        from ..layouts import pack_fp8_ds_mla
        cache = kw["kv_cache"]
        kw["kv_cache"] = pack_fp8_ds_mla(cache.float()).view(*cache.shape[:-1], -1)
        kw["query"] = kw["query"].to(torch.bfloat16)
    if buffers:
        kw["out"] = _nan((len(seq_lens), q_len, heads, 512), torch.bfloat16, d)
        kw["lse"] = _nan((len(seq_lens) * q_len, heads), torch.float32, d)
    return kw


def _sparse_cases() -> list[Case]:
    """16 heads (musa_fp8 and the reference), and 64, the head tile of WGMMA kernels, on both row layouts."""
    return [Case("sparse_decode", "fp8 q_len=1 top_k=128 lens [128, 0, 65, 64], -1 slots",
                 lambda d: _sparse(d, 1, False)),
            Case("sparse_decode", "fp8 q_len=2 into NaN-filled out / lse buffers", lambda d: _sparse(d, 2, True)),
            Case("sparse_decode", "fp8 q_len=1 without lse", lambda d: {**_sparse(d, 1, False), "return_lse": False}),
            Case("sparse_decode", "fp8 64 heads q_len=2 into NaN-filled buffers",
                 lambda d: _sparse(d, 2, True, heads=64)),
            Case("sparse_decode", "fp8_ds_mla (656-byte rows, bf16 query) 64 heads q_len=1 into NaN-filled buffers",
                 lambda d: _sparse(d, 1, True, heads=64, ds_mla=True))]


_CASES = {"decode": _decode_cases, "prefill": _prefill_cases, "merge": _merge_cases,
          "rope_quantize_fp8": _rope_cases, "sparse_decode": _sparse_cases}


def cases(op: str) -> list[Case]:
    """The calls the suite runs for ``op`` (one of :data:`COVERED_OPS`)."""
    return _CASES[op]()


def op_vocabulary(op: str) -> tuple[list[str], list[str]]:
    """``(parameter names, feature names)`` of ``op``'s problems, as validation builds them from the suite's calls.

    What a backend may name in ``OpCapability(limits=..., features=...)``; docs/plugins.md's tables come from here.
    """
    params: set[str] = set()
    features: set[str] = set()
    for case in cases(op):
        problem = validate(op, **case.build("cpu"))[0]
        params.update(k for k, _ in problem.params)
        features.update(problem.features)
    return sorted(params), sorted(features)


# --------------------------------------------------------------------------------------------------
# the checks


def _as_list(result) -> list:
    return [result] if isinstance(result, torch.Tensor) else list(result)


def _structure(op: str, got, want, kwargs: dict[str, Any], device: torch.device) -> list[str]:
    """What is wrong with the result's form: count, None positions, shapes, dtypes, contiguity, device, buffers."""
    got, want = _as_list(got), _as_list(want)
    if len(got) != len(want):
        return [f"returned {len(got)} items, the op returns {len(want)}"]
    errors = []
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or g is None:
            if (w is None) != (g is None):
                errors.append(f"result[{i}] is {'None' if g is None else 'a tensor'}, the op returns "
                              f"{'None' if w is None else 'a tensor'} there")
            continue
        if not isinstance(g, torch.Tensor):
            errors.append(f"result[{i}] is a {type(g).__name__}, not a tensor")
            continue
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            errors.append(f"result[{i}] is {str(g.dtype)[6:]} {list(g.shape)}, the op returns {str(w.dtype)[6:]} "
                          f"{list(w.shape)}")
        elif not g.is_contiguous():
            errors.append(f"result[{i}] is not contiguous (strides {tuple(g.stride())}); outputs must be, as the "
                          "fake kernels of torch.compile say")
        if g.device != device:
            errors.append(f"result[{i}] is on {g.device}, the inputs on {device}")
    for name, pos in OUTPUT_BUFFERS[op].items():
        buf = kwargs.get(name)
        if isinstance(buf, torch.Tensor) and pos < len(got) and isinstance(got[pos], torch.Tensor) \
                and got[pos].data_ptr() != buf.data_ptr():
            errors.append(f"the caller's {name} buffer was not written in place and returned as result[{pos}]")
    return errors


def _numerics(got, want, kwargs: dict[str, Any], op: str) -> str | None:
    """None when the result matches the reference within tolerance; else what is off."""
    err = compare(got, want)
    tensors = [t for t in _as_list(want) if t is not None]
    tol = tolerance(tensors[0].dtype) if tensors else 0.0
    if not err < tol:
        return f"relative L2 error {err:.3g} against the reference >= tolerance {tol:g}" + (
            " (NaN, or a -inf/inf row that differs: empty rows give output 0 and LSE -inf)" if err == float("inf")
            else "")
    for name in OUTPUT_BUFFERS[op]:  # what a kernel skipped stays NaN in a given buffer
        buf = kwargs.get(name)
        if isinstance(buf, torch.Tensor) and torch.isnan(buf.float()).any():
            return f"NaN left in the caller's {name} buffer (an element was not written)"
    return None


def _device_for(backend: Backend, device: str | None) -> tuple[str | None, str | None]:
    """The device to test on, or ``(None, why not)``."""
    from ..cli import runnable_device_types
    here = runnable_device_types()
    if device is not None:
        if device not in here:
            return None, f"device {device!r} is not available on this machine"
        return device, None
    for candidate in ("cuda", "cpu"):
        if candidate in backend.device_types and candidate in here:
            return candidate, None
    return None, f"none of its devices ({', '.join(sorted(backend.device_types))}) is available here"


def _declarations(backend: Backend, ops: list[str]) -> tuple[list[str], list[str]]:
    errors, notes = [], []
    for op, cap in backend.capabilities.items():
        if op not in OPS:
            errors.append(f"capabilities names {op!r}, which is not an mla_core op ({', '.join(OPS)})")
            continue
        if not callable(getattr(backend, op, None)):
            errors.append(f"capabilities declares {op!r} but the backend has no method {op}(call, config)")
        if op not in COVERED_OPS or op not in ops:
            continue
        params, features = op_vocabulary(op)
        for key in cap.limits:
            if key not in params:
                errors.append(f"capabilities[{op!r}].limits names {key!r}, which is not a Problem parameter of "
                              f"{op} (they are: {', '.join(params)}); the limit restricts nothing")
        for feat in sorted(set(cap.features) - set(features)):
            errors.append(f"capabilities[{op!r}].features names {feat!r}, which no {op} call needs "
                          f"(features of {op}: {', '.join(features) or 'none'})")
    for op in backend.capabilities:
        if op in OPS and op not in COVERED_OPS:
            notes.append(f"op {op!r} is declared but not covered by this suite (test it yourself)")
    return errors, notes


def _configs(backend: Backend, problem) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        configs = backend.configs(problem)
    except Exception as exc:
        return None, f"configs() raised {type(exc).__name__}: {exc}"
    if not isinstance(configs, list) or not configs:
        return None, f"configs() returned {configs!r}; it must be a non-empty list of dicts (the first is the default)"
    for c in configs:
        if not isinstance(c, dict):
            return None, f"configs() returned {c!r} among its configs; each must be a dict"
        try:
            json.dumps(c)
        except (TypeError, ValueError):
            return None, f"config {c!r} is not JSON-serializable (the autotune cache stores configs as JSON)"
    return configs, None


def _run_case(backend: Backend, case: Case, device: str, max_configs: int) -> list[CaseResult]:
    try:
        problem, _, _ = validate(case.op, **case.build(device))
    except Exception as exc:  # the suite's own call is refused by validation: a bug in the suite, reported
        return [CaseResult(case.op, case.name, "FAIL", f"the suite's call does not validate: {exc}")]
    try:
        why = backend.why_not(problem)
    except Exception as exc:
        return [CaseResult(case.op, case.name, "FAIL", f"why_not raised {type(exc).__name__}: {exc}")]
    if why:
        if not all(isinstance(r, str) and r.strip() for r in why):
            return [CaseResult(case.op, case.name, "FAIL", f"why_not refused with an empty reason: {why!r}")]
        return [CaseResult(case.op, case.name, "refused", "; ".join(why))]
    configs, error = _configs(backend, problem)
    if error:
        return [CaseResult(case.op, case.name, "FAIL", error)]
    ref_kwargs = case.build(device)
    want = getattr(get_backend(REFERENCE), problem.op)(validate(case.op, **ref_kwargs)[1], {})
    out = []
    for config in configs[:max_configs]:
        kwargs = case.build(device)
        _, call, _ = validate(case.op, **kwargs)
        try:
            got = getattr(backend, problem.op)(call, dict(config))  # the method itself: the suite judges its result
        except Exception as exc:
            out.append(CaseResult(case.op, case.name, "FAIL", f"why_not accepted the call but it raised "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", config))
            continue
        errors = _structure(case.op, got, want, kwargs, torch.device(device) if device != "cuda" else
                            torch.device("cuda", torch.cuda.current_device()))
        if not errors:
            bad = _numerics(got, want, kwargs, case.op)
            errors = [bad] if bad else []
        out.append(CaseResult(case.op, case.name, "FAIL" if errors else "pass", "; ".join(errors), config))
    return out


def check_backend(name: str | Backend, ops: list[str] | None = None, device: str | None = None, *,
                  max_configs: int = 4, raise_on_failure: bool = True) -> ConformanceReport:
    """Run the conformance suite on backend ``name`` (a loaded backend's name, or a Backend object).

    ``ops``: the ops to run (default: every op the backend declares); ``device``: ``"cpu"`` / ``"cuda"``
    (default: cuda when the backend runs there and a GPU is visible, else cpu); ``max_configs``: how many of
    ``configs(problem)`` are run per call. Raises :class:`ConformanceError` (an AssertionError, so pytest shows
    the report) when anything fails, unless ``raise_on_failure=False``; under pytest a backend that cannot run
    on this machine is skipped (``pytest.skip``). Returns the :class:`ConformanceReport`.
    """
    backend = name if isinstance(name, Backend) else get_backend(name)
    declared = [op for op in backend.capabilities if op in OPS]
    wanted = list(ops) if ops is not None else declared
    dev, why = _device_for(backend, device)
    report = ConformanceReport(backend.name, dev or "-")
    undeclared = [op for op in wanted if op not in declared]
    if undeclared:
        report.declaration_errors.append(f"asked to check {', '.join(undeclared)}, which the backend does not declare "
                                         f"(it declares: {', '.join(declared) or 'nothing'})")
    errors, notes = _declarations(backend, wanted)
    report.declaration_errors += errors
    report.notes += notes
    if dev is None:
        report.skipped = why
        if "pytest" in sys.modules and not report.declaration_errors:
            import pytest
            pytest.skip(f"conformance of {backend.name!r}: {why}")
    else:
        for op in wanted:
            if op not in COVERED_OPS or op not in declared:
                continue
            results = [r for case in cases(op) for r in _run_case(backend, case, dev, max_configs)]
            if results and all(r.status == "refused" for r in results):
                report.declaration_errors.append(
                    f"{op}: declared, but every call the suite built was refused (first reason: {results[0].detail}); "
                    "nothing was tested")
            report.results += results
        if backend.priority > 0 and dev == "cpu":
            report.notes.append(f"priority {backend.priority} is above the reference's 0: on the CPU this backend "
                                "serves every call it accepts unless a tuned choice says otherwise")
    if raise_on_failure and not report.ok:
        raise ConformanceError(str(report))
    return report


__all__ = ["COVERED_OPS", "Case", "CaseResult", "ConformanceError", "ConformanceReport", "FEATURES", "OUTPUT_BUFFERS",
           "cases", "check_backend", "op_vocabulary"]
