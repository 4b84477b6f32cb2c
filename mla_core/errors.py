"""Errors mla_core raises to its users."""
from __future__ import annotations


class MLAInputError(ValueError):
    """A public op was called with a bad argument; the message names it, what it got and what it needs."""


class NoBackendError(RuntimeError):
    """No backend can run a problem; the message lists every backend with its reasons."""

    def __init__(self, problem, reasons: dict[str, list[str]]):
        self.problem = problem
        self.reasons = reasons
        lines = [f"no mla_core backend can run {problem.describe()}:"]
        for name, why in reasons.items():
            lines.append(f"  `{name}` is not usable because:")
            lines.extend(f"    - {r}" for r in why)
        lines.append("Install or build a backend that supports this problem, or change the call (see `mla-core backends`).")
        super().__init__("\n".join(lines))
