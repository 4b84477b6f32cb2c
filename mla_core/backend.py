"""The ``Backend`` base class every backend plugin subclasses, its per-op ``OpCapability``, and the checks
every backend's configs and results go through (:meth:`Backend.validate_config`, :func:`check_result`)."""
from __future__ import annotations

import contextlib
import contextvars
import json
from dataclasses import dataclass, field
from typing import Any, Collection, Iterator, Mapping

import torch

from . import env
from .numerics import MAX_KV_SPLITS
from .problem import OPS, Problem
from .specs import SPARSE_LATENT, LayerDecodePrep


@dataclass(frozen=True)
class OpCapability:
    """What a backend can run for one op, as plain data.

    ``limits`` maps a :class:`~mla_core.problem.Problem` parameter name to the values supported
    (any container; a ``range`` works for head counts); parameters not named are unrestricted.
    ``features`` is the set of optional behaviours supported (a problem needing one outside it is
    rejected). ``notes`` is free text shown by ``mla-core backends``. ``why`` maps a limit's name or a
    feature to why the kernel does not run what is outside it (and who does): :meth:`why_not` then says
    ``"name=value: <why>"`` instead of listing the supported values.
    """

    limits: Mapping[str, Collection[Any]] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    notes: str = ""
    why: Mapping[str, str] = field(default_factory=dict)

    def why_not(self, problem: Problem) -> list[str]:
        reasons = []
        for name, allowed in self.limits.items():
            value = problem.get(name, _MISSING)
            if value is not _MISSING and value not in allowed:
                reasons.append(f"{name}={value}: {self.why[name]}" if name in self.why
                               else f"{name}={value} (supported: {_show(allowed)})")
        missing = problem.features - self.features
        reasons += [f"{feature}: {self.why[feature]}" for feature in sorted(missing) if feature in self.why]
        unexplained = sorted(f for f in missing if f not in self.why)
        if unexplained:
            reasons.append(f"needs {', '.join(unexplained)} (supported: {_show(self.features) or 'none'})")
        return reasons


_MISSING = object()


def _show(values: Collection[Any]) -> str:
    if isinstance(values, range):
        return f"{values.start}..{values.stop - 1}" + (f" step {values.step}" if values.step != 1 else "")
    return ", ".join(str(v) for v in sorted(values, key=str))


class Backend:
    """Base class of an mla_core backend.

    Subclasses set ``name``, ``version``, ``priority`` (higher wins when nothing is tuned; a backend whose
    speed depends on the problem overrides :meth:`priority_for`),
    ``device_types`` and ``capabilities`` (op name -> :class:`OpCapability`; ops absent are not
    supported), and implement one method per supported op, named after it, taking the validated
    call object from :mod:`mla_core.specs` and a config dict:

    ``decode(call: DecodeCall, config) -> (out, lse | None)``,
    ``prefill(call: PrefillCall, config) -> (out, lse | None)``,
    ``merge(call: MergeCall, config) -> (out, lse)``,
    ``rope_quantize_fp8(call: RopeQuantizeCall, config) -> (q_rope, k_rope, q_nope, k_nope)``,
    ``sparse_decode(call: SparseDecodeCall, config) -> (out, lse)``.

    A method writes into ``call.out`` / ``call.lse`` when they are given, and returns the tensors.
    Optional: ``decode_with_prep(call: DecodeCall, config, prep: LayerDecodePrep) -> (out, lse | None)``, the fused
    layer's decode with its prep run inside the backend's own launch (:meth:`run_decode_with_prep`).
    """

    name: str = "unnamed"
    version: str = "0"
    priority: int = 0
    device_types: frozenset[str] = frozenset({"cpu", "cuda"})
    capabilities: Mapping[str, OpCapability] = {}
    description: str = ""

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run at all on this machine (missing package, no GPU, failed build), or None."""
        return None

    def prepare(self) -> None:
        """Slow one-time setup :meth:`unavailable_reason` would otherwise do at first use (e.g. a kernel build);
        ``mla-core warmup`` runs it in a background thread while other backends' kernels compile ahead. Default:
        nothing. A failure must not raise: it shows later as :meth:`unavailable_reason`."""

    def device_reasons(self, problem: Problem) -> list[str]:
        """Reasons tied to the device (e.g. compute capability); the base checks only the device type."""
        if problem.device not in self.device_types:
            return [f"device={problem.device} (supported: {', '.join(sorted(self.device_types))})"]
        return []

    def why_not(self, problem: Problem) -> list[str]:
        """Every reason this backend cannot run ``problem``; an empty list means it can."""
        reason = self.unavailable_reason()
        if reason:
            return [f"unavailable: {reason}"]
        cap = self.capabilities.get(problem.op)
        if cap is None:
            return [f"op {problem.op!r} not implemented"]
        return self.device_reasons(problem) + cap.why_not(problem)

    def priority_for(self, problem: Problem) -> int:
        """The priority dispatch ranks this backend by for ``problem``, one it can run (default: ``priority``).

        ``priority`` is what ``mla-core backends`` shows; override this where the backend is faster for some
        problems than for others (e.g. the cudnn backend on dense prefill batches).
        """
        return self.priority

    def configs(self, problem: Problem) -> list[dict[str, Any]]:
        """Launch choices worth timing for ``problem`` (tile sizes, warps, stages...). The first is the default.

        A config changes speed, never numerics.
        """
        return [{}]

    def validate_config(self, problem: Problem, config: Any) -> list[str]:
        """Every reason ``config`` (e.g. read from an autotune cache file) must not run ``problem``; empty: valid.

        Default: the config must equal one of :meth:`configs` (values compared with their JSON types, so
        ``True`` is not ``1``), except that for a decode with ``num_kv_splits="auto"`` it may also carry a
        ``num_kv_splits`` (an int in 1..128, :data:`numerics.MAX_KV_SPLITS`: the tuner adds it). A backend that
        accepts more configs than it lists overrides this and checks every field's type and range itself.
        """
        if not isinstance(config, Mapping):
            return [f"config is a {type(config).__name__}, not an object"]
        config = dict(config)
        reasons = []
        if "num_kv_splits" in config:
            splits = config.pop("num_kv_splits")
            if problem.op != "decode" or problem.get("num_kv_splits") != "auto":
                reasons.append("num_kv_splits is tuned only for a decode called with num_kv_splits='auto'")
            elif type(splits) is not int or not 1 <= splits <= MAX_KV_SPLITS:
                reasons.append(f"num_kv_splits={splits!r} (needs an int in 1..{MAX_KV_SPLITS})")
        listed = {_canonical({k: v for k, v in c.items() if k != "num_kv_splits"}) for c in self.configs(problem)}
        if _canonical(config) not in listed:
            reasons.append(f"config {_canonical(config)} is not one of {self.name}'s {len(listed)} configs for "
                           "this problem")
        return reasons

    def run(self, problem: Problem, call: Any, config: Mapping[str, Any] | None = None):
        """Run ``problem.op`` on a validated call with ``config`` (default: the first of :meth:`configs`).

        In ``full`` checks mode (and inside :func:`result_checks`) the result's shapes, dtypes, devices
        and contiguity are checked against the op's spec (:func:`check_result`); a wrong one raises
        :class:`BackendOutputError` naming this backend.
        """
        if config is None:
            config = self.configs(problem)[0]
        result = getattr(self, problem.op)(call, dict(config))
        if _result_checks_on(call):
            check_result(self.name, problem, call, result)
        return result

    def decode_prep_reason(self) -> str | None:
        """Why this backend cannot run the fused layer's decode prep inside its decode call
        (:meth:`run_decode_with_prep`), or None when it can. Default: it has no such path (no ``decode_with_prep``)."""
        if getattr(self, "decode_with_prep", None) is None:
            return f"{self.name} has no decode_with_prep"
        return None

    def run_decode_with_prep(self, problem: Problem, call: Any, config: Mapping[str, Any],
                             prep: LayerDecodePrep):
        """:meth:`run` of a decode whose inputs the fused layer's prep (:class:`~mla_core.specs.LayerDecodePrep`)
        writes first, inside this backend's own launch; only where :meth:`decode_prep_reason` is None. The backend
        implements ``decode_with_prep(call: DecodeCall, config, prep) -> (out, lse | None)``; results checked as
        :meth:`run`'s."""
        result = self.decode_with_prep(call, dict(config), prep)
        if _result_checks_on(call):
            check_result(self.name, problem, call, result)
        return result

    def info(self) -> dict[str, Any]:
        """What ``mla-core backends`` prints for this backend (a raising ``unavailable_reason`` is the reason)."""
        try:
            reason = self.unavailable_reason()
        except Exception as exc:  # a plugin's bug is shown, never a traceback
            reason = f"unavailable_reason() raised {type(exc).__name__}: {exc}"
        return {
            "name": self.name,
            "version": self.version,
            "priority": self.priority,
            "devices": sorted(self.device_types),
            "available": reason is None,
            "reason": reason,
            "description": self.description,
            "ops": {op: {"limits": {k: _show(v) for k, v in cap.limits.items()},
                         "features": sorted(cap.features), "notes": cap.notes}
                    for op, cap in self.capabilities.items() if op in OPS},
        }


def _canonical(config: Mapping[str, Any]) -> str:
    """A config as sorted JSON text: equal texts are equal configs with equal value types."""
    try:
        return json.dumps(dict(config), sort_keys=True)
    except (TypeError, ValueError):
        return repr(sorted(dict(config).items(), key=lambda kv: str(kv[0])))


# --------------------------------------------------------------------------------------------------
# results


class BackendOutputError(RuntimeError):
    """A backend returned a result that does not match its op's spec (shape, dtype, device, layout)."""


_forced_result_checks: contextvars.ContextVar[bool] = contextvars.ContextVar("mla_core_result_checks", default=False)


@contextlib.contextmanager
def result_checks() -> Iterator[None]:
    """Check every backend result inside the block, whatever ``MLA_CORE_CHECKS`` says (``mla-core check``)."""
    token = _forced_result_checks.set(True)
    try:
        yield
    finally:
        _forced_result_checks.reset(token)


def _first_tensor(call: Any) -> torch.Tensor | None:
    for name in ("q", "prefix_output", "q_rope", "query"):
        t = getattr(call, name, None)
        if isinstance(t, torch.Tensor):
            return t
    return None


def _result_checks_on(call: Any) -> bool:
    """Result checks run in ``full`` mode (or when forced), never while compiling or capturing a CUDA graph."""
    if not (_forced_result_checks.get() or env.checks_mode() == "full"):
        return False
    if torch.compiler.is_compiling():
        return False
    t = _first_tensor(call)
    return not (t is not None and t.is_cuda and torch.cuda.is_current_stream_capturing())


def expected_result(op: str, call: Any) -> list[tuple[str, tuple[int, ...], torch.dtype, torch.device,
                                                        torch.Tensor | None, bool]] | None:
    """What an op's result must hold: per returned item ``(name, shape, dtype, device, given buffer, required)``.

    ``required`` False: the item may be None (an LSE nobody asked for). None: the op is not checked.
    """
    if op == "decode":
        q = call.q
        batch, heads = q.shape[0], q.shape[1]
        return [("out", (batch, heads, call.kv_lora_rank), call.out_dtype, q.device, None, True),
                ("lse", (batch, heads), torch.float32, q.device, None, call.return_lse)]
    if op == "prefill":
        total_q, heads = call.q.shape[0], call.q.shape[1]
        return [("out", (total_q, heads, call.v.shape[2]), call.v.dtype, call.q.device, None, True),
                ("lse", (heads, total_q), torch.float32, call.q.device, None, call.return_lse)]
    if op == "merge":
        pre = call.prefix_output
        dtype = call.output.dtype if call.output is not None else pre.dtype
        return [("output", tuple(pre.shape), dtype, pre.device, call.output, True),
                ("output_lse", (pre.shape[1], pre.shape[0]), torch.float32, pre.device, call.output_lse, True)]
    if op == "rope_quantize_fp8":
        fp8 = torch.float8_e4m3fn
        return [(name + "_out", tuple(getattr(call, name).shape), fp8, call.q_rope.device,
                 getattr(call, name + "_out"), True) for name in ("q_rope", "k_rope", "q_nope", "k_nope")]
    if op == "sparse_decode":
        query = call.query
        batch, q_len, heads = query.shape[:3]
        return [("out", (batch, q_len, heads, SPARSE_LATENT), torch.bfloat16, query.device, call.out, True),
                ("lse", (batch, q_len, heads), torch.float32, query.device, call.lse, True)]
    return None


def check_result(backend: str, problem: Problem, call: Any, result: Any) -> None:
    """Raise :class:`BackendOutputError` naming ``backend`` when ``result`` does not fit ``problem.op``'s spec.

    Reads only tensor metadata (no device sync): shapes, dtypes, devices, contiguity of new tensors, and
    that a caller's output buffer was written in place and returned.
    """
    expected = expected_result(problem.op, call)
    if expected is None:
        return
    items = (result,) if isinstance(result, torch.Tensor) else result
    if not isinstance(items, (tuple, list)) or len(items) != len(expected):
        raise BackendOutputError(f"backend {backend!r} returned {type(result).__name__} for {problem.op}; the op's "
                                 f"spec needs a tuple of {len(expected)} ({', '.join(e[0] for e in expected)})")
    for got, (name, shape, dtype, device, given, required) in zip(items, expected):
        if got is None and not required:
            continue
        what = f"backend {backend!r} returned a wrong {problem.op} {name}: "
        if not isinstance(got, torch.Tensor):
            raise BackendOutputError(what + f"{type(got).__name__}, needs a tensor")
        if tuple(got.shape) != tuple(shape):
            raise BackendOutputError(what + f"shape {list(got.shape)}, needs {list(shape)}")
        if got.dtype != dtype:
            raise BackendOutputError(what + f"dtype {got.dtype}, needs {dtype}")
        if got.device != device:
            raise BackendOutputError(what + f"device {got.device}, needs {device}")
        if given is not None:
            if got.data_ptr() != given.data_ptr():
                raise BackendOutputError(what + "a new tensor, needs the given buffer written in place")
        elif not got.is_contiguous():
            raise BackendOutputError(what + f"strides {list(got.stride())}, needs a contiguous tensor")
