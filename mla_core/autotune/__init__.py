"""The autotuner: per-problem timing of every valid ``(backend, config)``, its on-disk cache, and warm-up.

:mod:`~mla_core.autotune.tuner` times and judges candidates and answers dispatch (its choice sources
are registered with :func:`mla_core.dispatch.add_choice_source` when this package is imported);
:mod:`~mla_core.autotune.cache` keeps choices on disk (docs/autotune.md); :mod:`~mla_core.autotune.warmup`
fills the cache for a model's shapes ahead of time (``mla-core warmup``), after
:mod:`~mla_core.autotune.precompile` has compiled its kernels in parallel processes.
"""
from .. import dispatch
from . import cache, tuner, warmup
from .tuner import (ENV_MODE, MODES, AutotuneWarning, Candidate, TuneResult, install, mode, record, sync, tune)

for _source in tuner.CHOICE_SOURCES:
    dispatch.add_choice_source(_source)

__all__ = ["ENV_MODE", "MODES", "AutotuneWarning", "Candidate", "TuneResult", "cache", "install", "mode", "record",
           "sync", "tune", "tuner", "warmup"]
