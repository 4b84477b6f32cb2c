"""Autotuner and on-disk cache of dispatch choices (shared/DESIGN.md, "Autotuner and cache").

Placeholder interface until the autotuner lands: :func:`lookup` finds no tuned choice, so dispatch
falls back to the priority rule.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .problem import Problem

if TYPE_CHECKING:
    from .backend import Backend
    from .dispatch import Choice


def lookup(problem: Problem, valid: "list[Backend]") -> "Choice | None":
    """A cached or freshly tuned choice among ``valid`` backends for ``problem``, or None."""
    return None
