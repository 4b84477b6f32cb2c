"""Dispatch: overrides, priority, NoBackendError, in-memory choices."""
import dataclasses

import pytest
import torch

import mla_core
from mla_core import dispatch, inputs, plugins, specs


class _Fake(mla_core.Backend):
    device_types = frozenset({"cpu"})

    def __init__(self, name, priority, caps):
        self.name, self.priority, self.capabilities, self.calls = name, priority, caps, 0

    def merge(self, call, config):
        self.calls += 1
        return mla_core.get_backend("reference").merge(call, config)


@pytest.fixture
def fakes():
    hi = _Fake("fake_high", 1000, {"merge": mla_core.OpCapability(limits={"dtype": {"float32"}})})
    lo = _Fake("fake_low", 500, {"merge": mla_core.OpCapability()})

    class Plugin:
        @mla_core.hookimpl
        def mla_core_backends(self):
            return [hi, lo]

    mla_core.register_plugin(Plugin(), "fakes")
    yield hi, lo
    plugins.reload()


def test_capability_why_replaces_the_generic_line_for_the_limits_and_features_it_explains():
    """``OpCapability.why``: a refused value or a missing feature it explains reads ``name=value: why``; the rest
    keep the generic ``(supported: ...)`` line, listing only the unexplained features."""
    cap = mla_core.OpCapability(limits={"dtype": {"float32"}, "heads": range(1, 9)}, features=frozenset({"lse"}),
                                why={"dtype": "written for float32 sums", "nm_sparsity": "no key groups here"})
    problem = mla_core.Problem.make("prefill", "cpu", {"lse", "nm_sparsity", "gqa"}, dtype="bfloat16", heads=16)
    assert cap.why_not(problem) == ["dtype=bfloat16: written for float32 sums", "heads=16 (supported: 1..8)",
                                    "nm_sparsity: no key groups here", "needs gqa (supported: lse)"]
    fine = mla_core.Problem.make("prefill", "cpu", {"lse"}, dtype="float32", heads=8)
    assert cap.why_not(fine) == []


def _merge_args(dtype=torch.float32):
    return inputs.merge_inputs(5, heads=2, head_dim=8, dtype=dtype, seed=1)


def test_highest_priority_valid_backend_wins_and_reasons_are_kept(fakes):
    hi, lo = fakes
    mla_core.merge_attn_states(**_merge_args(torch.float32))
    assert (hi.calls, lo.calls) == (1, 0)
    mla_core.merge_attn_states(**_merge_args(torch.bfloat16))  # fake_high declares float32 only
    assert (hi.calls, lo.calls) == (1, 1)
    problem, _ = specs.validate_merge(**_merge_args(torch.bfloat16), output=None, output_lse=None)
    assert dispatch.candidates(problem)[1]["fake_high"] == ["dtype=bfloat16 (supported: float32)"]


def test_overrides_argument_context_and_env(fakes, monkeypatch):
    hi, lo = fakes
    mla_core.merge_attn_states(**_merge_args(), backend="fake_low")
    assert lo.calls == 1
    with mla_core.use_backend("fake_low"):
        mla_core.merge_attn_states(**_merge_args())
    assert lo.calls == 2
    monkeypatch.setenv("MLA_CORE_BACKEND", "fake_low")
    mla_core.merge_attn_states(**_merge_args())
    assert lo.calls == 3
    mla_core.merge_attn_states(**_merge_args(), backend="fake_high")  # the argument beats the env
    assert hi.calls == 1


def test_unknown_backend_names_are_errors_listing_known_ones():
    with pytest.raises(mla_core.MLAInputError, match=r"backend: got 'nope'.*known: .*reference"):
        mla_core.merge_attn_states(**_merge_args(), backend="nope")
    with pytest.raises(mla_core.MLAInputError, match="known"):
        with mla_core.use_backend("nope"):
            pass


def test_forced_backend_that_cannot_run_the_problem_says_why(fakes):
    with pytest.raises(mla_core.NoBackendError, match=r"fake_high.*\n.*dtype=bfloat16"):
        mla_core.merge_attn_states(**_merge_args(torch.bfloat16), backend="fake_high")


def test_no_backend_error_lists_every_backend_with_reasons(monkeypatch):
    class Nothing(mla_core.Backend):
        name = "nothing"

    monkeypatch.setattr(plugins.registry(), "backends", {"nothing": Nothing()})
    dispatch.clear_memory()
    try:
        with pytest.raises(mla_core.NoBackendError) as info:
            mla_core.merge_attn_states(**_merge_args())
        assert "`nothing` is not usable because" in str(info.value)
        assert "op 'merge' not implemented" in str(info.value)
    finally:
        dispatch.clear_memory()


def test_choice_is_remembered_in_memory(fakes):
    problem, _ = specs.validate_merge(**_merge_args(), output=None, output_lse=None)
    first = dispatch.choose(problem)
    assert dispatch.choose(problem) is first


def test_problem_key_round_trips():
    args = inputs.decode_inputs([3, 40], heads=4, page_size=16)
    problem, _ = specs.validate_decode(**args, page_size=None, num_kv_splits="auto", k_qdq="fp8", k_qdq_amax=None,
                                       v_qdq=None, v_qdq_amax=None, p_qdq="nvfp4", p_qdq_amax=1.0, return_lse=True,
                                       out_dtype=None)
    assert mla_core.Problem.from_key(problem.key()) == problem
    assert problem["max_len"] == 64 and problem["batch"] == 2


def test_problem_hash_is_the_fields_hash_once_and_never_pickled():
    """Problem keeps the generated hash's value (its fields' tuple) after the first call; equal problems hash
    alike whether or not one was hashed before; a pickle or copy carries the fields only (a string hash differs
    between processes)."""
    import copy
    import pickle

    from mla_core.problem import Problem
    p = Problem.make("decode", "cuda", {"lse"}, heads=16, batch=1, dtype="bfloat16")
    q = Problem.make("decode", "cuda", {"lse"}, heads=16, batch=1, dtype="bfloat16")
    assert hash(p) == hash(("decode", "cuda", p.params, p.features)) == hash(p) == hash(q)
    assert p == q and {p: 1}[q] == 1
    for other in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert other == p and "_hash" not in other.__dict__ and hash(other) == hash(p)
    assert b"_hash" not in pickle.dumps(p)
    r = dataclasses.replace(p, features=frozenset())
    assert r != p and hash(r) == hash(("decode", "cuda", p.params, frozenset()))
