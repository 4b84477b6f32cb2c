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
if os.environ.get("TRITON_INTERPRET") == "1":
    # Decorate every Triton kernel now, under the interpreter: @triton.jit picks interpreter or GPU mode when the
    # module is imported, so a kernel module first imported inside a test that unsets TRITON_INTERPRET (to keep a
    # backend off the CPU) would otherwise stay GPU-compiled and break every later interpreter test.
    import importlib
    import pkgutil
    for _package in ("mla_core_triton", "mla_core_musa_fp8", "mla_core_cudnn"):
        _pkg = importlib.import_module(_package)
        for _info in pkgutil.iter_modules(_pkg.__path__, _package + "."):
            importlib.import_module(_info.name)

sys.path.insert(0, os.path.dirname(__file__))  # test helpers (reference_math.py) import as plain modules

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with `pytest -m gpu` on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_GPU_DESELECTED = []


def pytest_deselected(items):
    """Count the GPU tests the default ``-m 'not gpu'`` leaves out (reported in the terminal summary)."""
    _GPU_DESELECTED.extend(item.nodeid for item in items if "gpu" in item.keywords)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say how many GPU tests did not run and why: they are the only coverage of the hardware paths."""
    if not _GPU_DESELECTED:
        return
    n = len(_GPU_DESELECTED)
    why = ("this machine has a CUDA device: run `pytest -m gpu` here" if torch.cuda.is_available()
           else "no CUDA device here; run `pytest -m gpu` on a GPU machine")
    terminalreporter.write_sep("-", "GPU coverage")
    terminalreporter.write_line(f"{n} GPU test{'s' * (n != 1)} deselected (-m 'not gpu'): {why}")


@pytest.fixture
def global_defaults():
    """Set torch's global defaults as model loaders do, for one test: ``global_defaults(dtype=..., device=...)``.

    ``torch.set_default_dtype`` / ``torch.set_default_device`` are process-wide; the previous values are
    restored when the test ends, pass or fail.
    """
    saved_dtype = torch.get_default_dtype()
    # None when no default device was set: restoring "cpu" instead would leave a device mode installed
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    saved_device = None if context is None else torch.get_default_device()

    def set_defaults(dtype=None, device=None):
        if dtype is not None:
            torch.set_default_dtype(dtype)
        if device is not None:
            torch.set_default_device(device)

    try:
        yield set_defaults
    finally:
        torch.set_default_dtype(saved_dtype)
        torch.set_default_device(saved_device)


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
