"""Every MLA_CORE_* variable with a bad value: one MLAInputError naming the variable, the value and what it accepts
(issue 7, item 9). On 6ed19c9 ``MLA_CORE_CHECKS=banana`` silently meant full checks and
``MLA_CORE_BACKEND=refrence`` failed without naming the variable."""
import logging
import os
import subprocess
import sys

import pytest
import torch

import mla_core
from mla_core import dispatch, env, inputs, plugins


def _merge():
    return mla_core.merge_attn_states(**inputs.merge_inputs(5, heads=2, head_dim=8, dtype=torch.float32, seed=1))


def _decode():
    args = inputs.decode_inputs([3, 40], heads=4, page_size=16)
    return mla_core.mla_decode(**args, backend="reference")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in env.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dispatch.clear_memory()
    yield
    dispatch.clear_memory()


def _says(exc_info, name, value, accepted):
    """One message for every variable: ``environment variable NAME='value' is not valid; accepted: ...``."""
    text = str(exc_info.value)
    assert f"environment variable {name}={value!r} is not valid; accepted: " in text and accepted in text, text


@pytest.mark.parametrize("op", [_merge, _decode])
def test_bad_checks_mode_is_an_error_at_the_first_op(monkeypatch, op):
    monkeypatch.setenv("MLA_CORE_CHECKS", "banana")
    with pytest.raises(mla_core.MLAInputError) as info:
        op()
    _says(info, "MLA_CORE_CHECKS", "banana", "metadata")


@pytest.mark.parametrize("value,mode", [("", "full"), ("full", "full"), ("FULL", "full"), ("all", "full"),
                                        ("metadata", "metadata"), (" metadata ", "metadata")])
def test_checks_modes(monkeypatch, value, mode):
    monkeypatch.setenv("MLA_CORE_CHECKS", value)
    assert env.checks_mode() == mode
    _merge()


def test_misspelt_backend_names_the_variable(monkeypatch):
    monkeypatch.setenv("MLA_CORE_BACKEND", "refrence")
    with pytest.raises(mla_core.MLAInputError) as info:
        _merge()
    _says(info, "MLA_CORE_BACKEND", "refrence", "reference")
    with pytest.raises(mla_core.MLAInputError, match=r"backend: got 'refrence'"):  # an argument names itself
        mla_core.merge_attn_states(**inputs.merge_inputs(5, heads=2, head_dim=8, dtype=torch.float32, seed=1),
                                   backend="refrence")
    monkeypatch.setenv("MLA_CORE_BACKEND", "reference")
    _merge()


def test_bad_autotune_mode_is_an_error_at_the_first_op(monkeypatch):
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "sometimes")
    with pytest.raises(mla_core.MLAInputError) as info:
        _merge()
    _says(info, "MLA_CORE_AUTOTUNE", "sometimes", "off | cached (default) | on")


def test_relative_cache_dir_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", "relative/cache")
    with pytest.raises(mla_core.MLAInputError) as info:
        _merge()
    _says(info, "MLA_CORE_CACHE_DIR", "relative/cache", "absolute")
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    assert env.cache_dir() == tmp_path


def test_bad_trace_plugins_is_an_error_when_plugins_load(monkeypatch):
    monkeypatch.setenv("MLA_CORE_TRACE_PLUGINS", "maybe")
    try:
        with pytest.raises(mla_core.MLAInputError) as info:
            plugins.reload()
        _says(info, "MLA_CORE_TRACE_PLUGINS", "maybe", "0 (default) | 1")
    finally:
        monkeypatch.delenv("MLA_CORE_TRACE_PLUGINS")
        plugins.reload()
    for value, on in (("1", True), ("yes", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv("MLA_CORE_TRACE_PLUGINS", value)
        assert env.trace_plugins() is on


def test_log_levels(monkeypatch):
    monkeypatch.setenv("MLA_CORE_LOG", "loud")
    with pytest.raises(mla_core.MLAInputError) as info:
        env.log_level()
    _says(info, "MLA_CORE_LOG", "loud", "debug")
    monkeypatch.setenv("MLA_CORE_LOG", "Debug")
    assert env.log_level() == logging.DEBUG
    monkeypatch.setenv("MLA_CORE_LOG", "off")
    assert env.log_level() is None


def test_problems_lists_every_bad_variable(monkeypatch):
    assert env.problems(mla_core.backends()) == []
    monkeypatch.setenv("MLA_CORE_CHECKS", "banana")
    monkeypatch.setenv("MLA_CORE_BACKEND", "refrence")
    monkeypatch.setenv("MLA_CORE_LOG", "loud")
    found = env.problems(mla_core.backends())
    assert len(found) == 3 and all("MLA_CORE_" in p for p in found)


def test_log_info_prints_each_first_dispatch_decision_once():
    code = ("import mla_core\nfrom mla_core import inputs\na = inputs.merge_inputs(4, heads=2, head_dim=8)\n"
            "mla_core.merge_attn_states(**a)\nmla_core.merge_attn_states(**a)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "MLA_CORE_LOG": "info"})
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("[mla_core.dispatch]")]
    assert len(lines) == 1 and "merge|cpu" in lines[0] and "(priority)" in lines[0], out.stderr
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "MLA_CORE_LOG"})
    assert "[mla_core.dispatch]" not in quiet.stderr


def test_per_call_variables_follow_every_change(monkeypatch):
    """MLA_CORE_CHECKS and MLA_CORE_BACKEND are read on every call (from os.environ's own dict, memoized on the raw
    entry): each set, change, blank and removal is seen by the next read."""
    for value, mode, name in (("metadata", "metadata", "triton"), ("full", "full", " reference "),
                              ("", "full", ""), ("METADATA", "metadata", "cuda"), (None, "full", None)):
        for var, got in ((env.CHECKS, value), (env.BACKEND, name)):
            if got is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, got)
        assert env.checks_mode() == mode
        assert env.backend_name() == (name.strip() or None if name is not None else None)
    os.environ[env.CHECKS] = "all"            # os.environ written directly, not through monkeypatch
    try:
        assert env.checks_mode() == "full"
        os.environ[env.CHECKS] = "metadata"
        assert env.checks_mode() == "metadata"
    finally:
        del os.environ[env.CHECKS]
    assert env.checks_mode() == "full"
