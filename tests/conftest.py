"""Test-session setup shared by every test file.

On a machine without CUDA, Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` must be in
the environment before any ``@triton.jit`` function is defined, so it is set here, before test modules
import the backends. GPU tests are marked ``gpu`` and deselected by default (pyproject addopts); run them
on the device with ``pytest -m gpu``.
"""
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(__file__))  # test helpers (reference_math.py) import as plain modules

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with `pytest -m gpu` on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_world(monkeypatch, tmp_path):
    """Autotuner tests: only the fake backends of autotune_fakes are loaded, tt_exact judges correctness,
    the user cache is a fresh folder and no shipped cache is visible."""
    import autotune_fakes
    from mla_core import dispatch
    from mla_core.autotune import cache, tuner
    from mla_core.plugins import registry

    fk = autotune_fakes.install()
    monkeypatch.setattr(registry(), "backends", dict(fk))
    monkeypatch.setattr(tuner, "REFERENCE", "tt_exact")
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLA_CORE_AUTOTUNE", raising=False)
    monkeypatch.setattr(cache, "shipped_dir", lambda: None)
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setattr(cache, "_unsaved", {})
    dispatch.clear_memory()
    yield fk
    dispatch.clear_memory()
