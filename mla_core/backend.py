"""The ``Backend`` base class every backend plugin subclasses, and its per-op ``OpCapability``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping

from .problem import OPS, Problem


@dataclass(frozen=True)
class OpCapability:
    """What a backend can run for one op, as plain data.

    ``limits`` maps a :class:`~mla_core.problem.Problem` parameter name to the values supported
    (any container; a ``range`` works for head counts); parameters not named are unrestricted.
    ``features`` is the set of optional behaviours supported (a problem needing one outside it is
    rejected). ``notes`` is free text shown by ``mla-core backends``.
    """

    limits: Mapping[str, Collection[Any]] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    notes: str = ""

    def why_not(self, problem: Problem) -> list[str]:
        reasons = []
        for name, allowed in self.limits.items():
            value = problem.get(name, _MISSING)
            if value is not _MISSING and value not in allowed:
                reasons.append(f"{name}={value} (supported: {_show(allowed)})")
        missing = problem.features - self.features
        if missing:
            reasons.append(f"needs {', '.join(sorted(missing))} (supported: {_show(self.features) or 'none'})")
        return reasons


_MISSING = object()


def _show(values: Collection[Any]) -> str:
    if isinstance(values, range):
        return f"{values.start}..{values.stop - 1}" + (f" step {values.step}" if values.step != 1 else "")
    return ", ".join(str(v) for v in sorted(values, key=str))


class Backend:
    """Base class of an mla_core backend.

    Subclasses set ``name``, ``version``, ``priority`` (higher wins when nothing is tuned),
    ``device_types`` and ``capabilities`` (op name -> :class:`OpCapability`; ops absent are not
    supported), and implement one method per supported op, named after it, taking the validated
    call object from :mod:`mla_core.specs` and a config dict:

    ``decode(call: DecodeCall, config) -> (out, lse | None)``,
    ``prefill(call: PrefillCall, config) -> (out, lse | None)``,
    ``merge(call: MergeCall, config) -> (out, lse)``,
    ``rope_quantize_fp8(call: RopeQuantizeCall, config) -> (q_rope, k_rope, q_nope, k_nope)``,
    ``sparse_decode(call: SparseDecodeCall, config) -> (out, lse)``.

    A method writes into ``call.out`` / ``call.lse`` when they are given, and returns the tensors.
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

    def configs(self, problem: Problem) -> list[dict[str, Any]]:
        """Launch choices worth timing for ``problem`` (tile sizes, warps, stages...). The first is the default.

        A config changes speed, never numerics.
        """
        return [{}]

    def run(self, problem: Problem, call: Any, config: Mapping[str, Any] | None = None):
        """Run ``problem.op`` on a validated call with ``config`` (default: the first of :meth:`configs`)."""
        if config is None:
            config = self.configs(problem)[0]
        return getattr(self, problem.op)(call, dict(config))

    def info(self) -> dict[str, Any]:
        """What ``mla-core backends`` prints for this backend."""
        return {
            "name": self.name,
            "version": self.version,
            "priority": self.priority,
            "devices": sorted(self.device_types),
            "available": self.unavailable_reason() is None,
            "reason": self.unavailable_reason(),
            "description": self.description,
            "ops": {op: {"limits": {k: _show(v) for k, v in cap.limits.items()},
                         "features": sorted(cap.features), "notes": cap.notes}
                    for op, cap in self.capabilities.items() if op in OPS},
        }
