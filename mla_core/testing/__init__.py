"""Test helpers for mla_core and its backend plugins.

* :func:`check_backend` (:mod:`mla_core.testing.conformance`): the conformance suite a plugin's tests call,
  ``check_backend("mybackend")``, which runs every declared op against the reference backend.
* :mod:`mla_core.testing.shapes`: lengths on every tile boundary of a kernel.
* :mod:`mla_core.testing.strategies`: Hypothesis strategies built on those shapes.
"""
from .conformance import ConformanceError, ConformanceReport, check_backend

__all__ = ["ConformanceError", "ConformanceReport", "check_backend"]
