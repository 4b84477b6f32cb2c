"""mla_core.explain and `mla-core explain`: the choice, its source, every other backend's reasons; nothing runs;
the first dispatch decision per problem is logged."""
import json
import logging

import pytest
import torch

import mla_core
from mla_core import cli, dispatch, inputs
from mla_core.autotune import cache
from mla_core.explain import explain_problem, validate


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No interpreter (triton cannot run on this CPU), an empty user cache, no shipped cache, no memory."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MLA_CORE_BACKEND", raising=False)
    monkeypatch.delenv("MLA_CORE_AUTOTUNE", raising=False)
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "shipped_dir", lambda: None)
    dispatch.clear_memory()
    yield tmp_path
    dispatch.clear_memory()


def _merge_args():
    return inputs.merge_inputs(9, heads=2, head_dim=16, dtype=torch.float32, seed=3)


def test_explain_is_exported_and_names_the_choice_source_and_every_other_backend(clean):
    kw = inputs.decode_inputs([5, 100], heads=16)
    e = mla_core.explain("mla_decode", **kw, k_qdq="nvfp4")
    assert e.backend == "reference" and e.source == "priority" and e.config == {}
    assert e.problem["k_qdq"] == "nvfp4" and e.problem.op == "decode"
    assert e.reasons["triton"] == ["device=cpu (supported: cuda)"]
    assert set(e.reasons) == set(mla_core.backends()) - {"reference"}
    text = str(e)
    assert "served by: reference" in text and "source: priority" in text and "triton: device=cpu" in text
    assert mla_core.explain("decode", **kw).problem["k_qdq"] is None  # the op's name or the problem's


def test_explain_runs_nothing(clean, monkeypatch):
    ref = mla_core.get_backend("reference")
    monkeypatch.setattr(type(ref), "merge", lambda self, call, config: pytest.fail("explain ran a kernel"))
    assert mla_core.explain("merge_attn_states", **_merge_args()).backend == "reference"
    assert not dispatch._memory  # and remembered nothing


def test_explain_validates_as_the_op_does(clean):
    kw = inputs.decode_inputs([5], heads=4)
    kw["q"] = kw["q"][:, :, :100]
    with pytest.raises(mla_core.MLAInputError) as by_op:
        mla_core.mla_decode(**kw)
    with pytest.raises(mla_core.MLAInputError) as by_explain:
        mla_core.explain("mla_decode", **kw)
    assert str(by_explain.value) == str(by_op.value)
    with pytest.raises(mla_core.MLAInputError, match="unexpected keyword argument 'bogus'"):
        mla_core.explain("merge", **_merge_args(), bogus=1)
    with pytest.raises(mla_core.MLAInputError, match="op_name: got 'nope'"):
        mla_core.explain("nope")


def test_sources_override_memory_cache_tuned(clean, monkeypatch):
    args = _merge_args()
    assert mla_core.explain("merge", **args, backend="reference").source == "override"
    with mla_core.use_backend("reference"):
        assert mla_core.explain("merge", **args).source == "override"
    problem, _, _ = validate("merge", **args)
    # a current user-cache entry
    ref = mla_core.get_backend("reference")
    cache.store("cpu", {problem.key(): {"backend": "reference", "config": {}, "us": 1.0,
                                        "versions": cache.versions(ref, "cpu")}})
    assert mla_core.explain("merge", **args).source == "cache"
    cache.clear("cpu")
    # tuning enabled and nothing cached: explain says the first call tunes, and tunes nothing itself
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "on")
    e = mla_core.explain("merge", **args)
    assert e.source == "tuned" and "first call tunes" in e.note and e.backend == "reference"
    assert cache.user_entries("cpu") == {}
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")
    mla_core.merge_attn_states(**args)  # the first call decides
    e = mla_core.explain("merge", **args)
    assert e.source == "memory" and e.first_source == "priority"


def test_no_backend_is_an_error_listing_reasons(clean):
    with pytest.raises(mla_core.NoBackendError, match="device=cpu"):
        mla_core.explain("merge", **_merge_args(), backend="triton")


def test_a_valid_but_unchosen_backend_says_why(clean, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton can run merge on the CPU now, at priority 200
    e = explain_problem(validate("merge", **_merge_args())[0])
    assert e.backend == "triton" and e.valid[-1] == "reference"
    assert "valid (priority 0), but not chosen: triton (priority 200)" in e.reasons["reference"][0]


def test_first_dispatch_decision_per_problem_is_logged(clean, caplog):
    args = _merge_args()
    with caplog.at_level(logging.INFO, logger="mla_core.dispatch"):
        mla_core.merge_attn_states(**args)
        mla_core.merge_attn_states(**args)
    lines = [r.getMessage() for r in caplog.records if r.name == "mla_core.dispatch"]
    assert len(lines) == 1 and lines[0].startswith("merge|cpu|") and "-> reference {} (priority)" in lines[0]


def test_cli_explain_decode_prints_choice_and_reasons(clean, capsys):
    code = cli.main(["explain", "decode", "--heads", "16", "--batch", "32", "--length", "8192", "--recipe", "nvfp4",
                     "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    assert "decode B=32 H=16 L=8192 nvfp4 on cpu" in out and "served by: reference" in out
    assert "k_qdq=nvfp4" in out and "max_len=8192" in out and "batch=32" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="explains a GPU call on a machine without one")
def test_cli_explain_for_cuda_without_a_gpu(clean, capsys):
    code = cli.main(["explain", "decode", "--heads", "16", "--batch", "32", "--length", "8192", "--recipe", "nvfp4",
                     "--device", "cuda", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data[0]["problem"]["device"] == "cuda"
    assert data[0]["backend"] != "reference" and "reference" in data[0]["valid"]


@pytest.mark.parametrize("op", ["prefill", "merge", "rope", "sparse"])
def test_cli_explain_every_op(clean, capsys, op):
    code = cli.main(["explain", op, "--device", "cpu", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data[0]["backend"] == "reference" and data[0]["source"] == "priority"
