"""The tuner's correctness check on a sample of heads: the sample, its exactness, and what it rejects."""
import dataclasses

import pytest
import torch

import autotune_fakes as fakes
import mla_core
from mla_core import inputs
from mla_core.accuracy import compare, output_dtype, tolerance
from mla_core.autotune import tuner
from mla_core.problem import Problem


def test_check_heads_picks_ends_middle_tile_boundaries_and_one_hashed_head():
    sixteen = tuner.check_heads(16, "k")
    assert len(sixteen) == 4 and {0, 8, 15} <= set(sixteen) and sixteen == sorted(sixteen)
    many = tuner.check_heads(128, "k")
    assert {0, 15, 16, 63, 64, 127} <= set(many) and len(many) == 7
    assert tuner.check_heads(16, "k") == sixteen  # deterministic
    extras = {next(h for h in tuner.check_heads(16, f"key{i}") if h not in (0, 8, 15)) for i in range(40)}
    assert len(extras) > 5  # the hashed head moves between problem keys
    assert tuner.check_heads(4, "k") is None and len(tuner.check_heads(5, "k")) == 4


def _decode(heads, splits, batch=8, max_len=2048, p_qdq="fp8", k_qdq=None):
    return Problem.make("decode", "cpu", {"lse"}, dtype="float32", q_dtype="float32", out_dtype="float32",
                        heads=heads, kv_lora_rank=64, rope_dim=16, page_size=16, num_kv_splits=splits, k_qdq=k_qdq,
                        v_qdq=k_qdq, p_qdq=p_qdq, batch=batch, max_len=max_len)


def _prefill(heads, kv_heads, fmt, features=("lse",)):
    return Problem.make("prefill", "cpu", set(features) | ({"gqa"} if kv_heads != heads else set()),
                        dtype="float32", heads=heads, kv_heads=kv_heads, qk_dim=48, v_dim=32, causal=1,
                        q_quant=None, k_quant=fmt, p_quant=fmt, v_quant=fmt, block_n=32, sparsity_m=0, batch=2,
                        max_seqlen_q=64, total_k=256)


SAMPLED = [
    _decode(16, 32, batch=2, max_len=256, k_qdq="nvfp4", p_qdq="nvfp4"),
    _decode(128, "auto", p_qdq="fp8"),  # the reference's split heuristic reads the head count (64-head groups)
    _prefill(16, 16, "nvfp4"),
    _prefill(16, 16, "fp8", features=()),
    _prefill(32, 8, None),  # GQA: whole kv-head groups
    Problem.make("merge", "cpu", dtype="bfloat16", out_dtype="float32", heads=16, head_dim=16, tokens=8),
]


@pytest.mark.parametrize("problem", SAMPLED, ids=lambda p: p.op + "-" + str(p["heads"]))
def test_the_reference_on_the_sampled_heads_equals_the_full_reference_cut_to_them(problem):
    reference = mla_core.get_backend("reference")
    call = inputs.make_call(problem, "cpu", seed=3)
    sample = tuner.head_sample(problem, call)
    assert sample is not None and len(sample.heads) < problem["heads"]
    full = tuner._outputs(reference.run(problem, call, {}))
    part = tuner._outputs(reference.run(sample.problem, sample.call, {}))
    cut = sample.take(full)
    assert [t.shape for t in cut] == [t.shape for t in part]
    # heads are independent, but not bitwise: the CPU's batched matmul may sum in another order for another head
    # count (1 ulp seen on an AVX-512 CPU), so the rule the tuner judges by (a wrong head is an O(1) error)
    assert compare(part, cut) < tolerance(output_dtype(part))
    if problem.op == "prefill" and problem["kv_heads"] != problem["heads"]:
        group = problem["heads"] // problem["kv_heads"]
        assert all(len([h for h in sample.heads if h // group == g]) in (0, group) for g in range(problem["kv_heads"]))


def test_decode_auto_splits_are_pinned_to_the_full_calls_count():
    problem = _decode(128, "auto")
    call = inputs.make_call(problem, "cpu")
    assert call.num_kv_splits is None
    sample = tuner.head_sample(problem, call)
    from mla_core import specs
    assert sample.call.num_kv_splits == specs.decode_num_splits(call, {}) == 17  # 8 x 2 head groups; sampled: 33
    assert specs.decode_num_splits(dataclasses.replace(sample.call, num_kv_splits=None), {}) == 33  # 8 x 1: 264 / 8


def test_ops_without_independent_heads_or_with_few_are_checked_whole():
    call = inputs.make_call(fakes.merge_problem(heads=4), "cpu")
    assert tuner.head_sample(fakes.merge_problem(heads=4), call) is None
    rope = Problem.make("rope_quantize_fp8", "cpu", dtype="bfloat16", cos_dtype="float32", heads=16, rope_dim=16,
                        nope_dim=32, neox=0, tokens=16)
    assert tuner.head_sample(rope, inputs.make_call(rope, "cpu")) is None


class _HeadBug(mla_core.Backend):
    """Exact merge except on one head: +1 there (``nan``: NaN there)."""

    name, device_types = "tt_headbug", frozenset({"cpu"})
    capabilities = {"merge": mla_core.OpCapability()}

    def __init__(self, head, nan=False):
        self.head, self.nan = head, nan

    def configs(self, problem):
        return [{}]

    def merge(self, call, config):
        out, lse = fakes.merge_math(call)
        if self.nan:
            out[:, self.head] = float("nan")
        else:
            out[:, self.head] += 1.0
        return out, lse


MERGE16 = fakes.merge_problem(heads=16)


def _sampled_and_not():
    call = inputs.make_call(MERGE16, "cpu")
    sampled = tuner.head_sample(MERGE16, call).heads
    return sampled, [h for h in range(16) if h not in sampled]


@pytest.mark.parametrize("which", range(4))
def test_a_candidate_wrong_on_one_sampled_head_is_rejected(which, tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    sampled, _ = _sampled_and_not()
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_headbug"):
        result = tuner.tune(MERGE16, [_HeadBug(sampled[which])], warmup=1, repeats=1)
    assert result.winner is None and "differs from reference on heads" in result.rejected[0]["reason"]


def test_a_wrong_unsampled_head_passes_the_sampled_check_a_nan_there_does_not(tmp_path, monkeypatch):
    """What the sample cannot see: a finite error on a head it does not judge (the full check catches it)."""
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    sampled, unsampled = _sampled_and_not()
    passed = tuner.tune(MERGE16, [_HeadBug(unsampled[0])], warmup=1, repeats=1)
    assert passed.winner is not None and f"on heads {','.join(map(str, sampled))} of 16" in passed.check
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_headbug"):
        full = tuner.tune(MERGE16, [_HeadBug(unsampled[0])], warmup=1, repeats=1, check_sampled=False)
    assert full.winner is None and "differs from reference:" in full.rejected[0]["reason"]
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_headbug"):
        nan = tuner.tune(MERGE16, [_HeadBug(unsampled[-1], nan=True)], warmup=1, repeats=1)
    assert nan.winner is None and nan.rejected[0]["reason"].startswith("NaN in its output")


def test_a_correct_candidate_passes_the_sampled_check(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    result = tuner.tune(MERGE16, [fakes.Fast()], warmup=1, repeats=1)
    assert result.winner.backend == "tt_fast" and not result.rejected and "of 16 (tolerance" in result.check


# ------------------------------------------------------------------------------------------------
# one reference run for a prefill tuned without and then with LSE (warm-up's order)


def _prefill_pair(heads=16):
    base = _prefill(heads, heads, "fp8", features=())
    return base, Problem.make("prefill", "cpu", {"lse"}, **dict(base.params))


class _RefPrefill(mla_core.Backend):
    """The reference's prefill as a candidate (``lse_bias``: its LSE off by that much)."""

    name, device_types = "tt_ref_prefill", frozenset({"cpu"})
    capabilities = {"prefill": mla_core.OpCapability(features=frozenset({"lse"}))}

    def __init__(self, lse_bias=0.0):
        self.lse_bias = lse_bias

    def configs(self, problem):
        return [{}]

    def prefill(self, call, config):
        from mla_core_reference.prefill import mla_prefill_reference  # not the counted backend method
        out, lse = mla_prefill_reference(call)
        return out, (lse + self.lse_bias if lse is not None else None)


@pytest.fixture
def counted_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuner, "_shared_reference", None)
    reference = mla_core.get_backend("reference")
    calls = []
    original = type(reference).prefill
    monkeypatch.setattr(type(reference), "prefill", lambda self, call, config: calls.append(call) or
                        original(self, call, config))
    return calls


@pytest.mark.parametrize("heads", [16, 4])  # sampled, and every head
def test_a_prefill_without_then_with_lse_runs_the_reference_once(counted_reference, heads):
    plain, lse = _prefill_pair(heads)
    first = tuner.tune(plain, [_RefPrefill()], warmup=1, repeats=1)
    second = tuner.tune(lse, [_RefPrefill()], warmup=1, repeats=1)
    assert first.winner and second.winner and "against reference" in second.check
    assert len(counted_reference) == 1 and counted_reference[0].return_lse  # run once, with LSE, kept
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_ref_prefill"):
        wrong_lse = tuner.tune(lse, [_RefPrefill(lse_bias=0.5)], warmup=1, repeats=1)
    assert wrong_lse.winner is None and len(counted_reference) == 1  # the kept LSE judged it


def test_a_warm_up_leaves_no_kept_reference_behind(counted_reference, monkeypatch):
    from mla_core.autotune import warmup
    plain, lse = _prefill_pair()
    real_tune = tuner.tune
    monkeypatch.setattr(tuner, "tune", lambda problem, **kw: real_tune(problem, [_RefPrefill()], warmup=1, repeats=1))
    rows = warmup.run([plain, lse])
    assert [r.status for r in rows] == ["tuned", "tuned"] and len(counted_reference) == 1  # shared during it
    assert tuner._shared_reference is None  # its tensors (result and inputs) are not kept past the warm-up


def test_the_kept_reference_is_not_used_for_other_inputs_or_another_judge(counted_reference):
    plain, lse = _prefill_pair()
    tuner.tune(plain, [_RefPrefill()], warmup=1, repeats=1)
    tuner.tune(lse, [_RefPrefill()], warmup=1, repeats=1, seed=1)  # other inputs: the reference runs again
    assert len(counted_reference) == 2
    other = Problem.make("prefill", "cpu", {"lse"}, **{**dict(lse.params), "max_seqlen_q": 32})
    tuner.tune(other, [_RefPrefill()], warmup=1, repeats=1, seed=1)
    assert len(counted_reference) == 3
    call = inputs.make_call(lse, "cpu", seed=1)
    assert tuner._same_inputs(call, inputs.make_call(lse, "cpu", seed=1))
    assert not tuner._same_inputs(call, dataclasses.replace(call, q=call.q.clone().add_(1e-3)))
    assert not tuner._same_inputs(call, dataclasses.replace(call, causal=False))


# ------------------------------------------------------------------------------------------------
# on the device: the sampled reference against the full one, and a real tune judged on sampled heads

GPU_SAMPLED = [
    Problem.make("decode", "cuda", {"lse"}, dtype="bfloat16", q_dtype="bfloat16", out_dtype="bfloat16", heads=16,
                 kv_lora_rank=512, rope_dim=64, page_size=64, num_kv_splits=32, k_qdq="nvfp4", v_qdq="nvfp4",
                 p_qdq="nvfp4", batch=4, max_len=1024),
    Problem.make("prefill", "cuda", {"lse"}, dense_batch=1, dtype="bfloat16", heads=16, kv_heads=16, qk_dim=192,
                 v_dim=128, causal=1, q_quant=None, k_quant="fp8", p_quant="fp8", v_quant="fp8", block_n=64,
                 sparsity_m=0, batch=1, max_seqlen_q=512, total_k=1024),
    Problem.make("merge", "cuda", dtype="bfloat16", out_dtype="bfloat16", heads=16, head_dim=128, tokens=256),
]


@pytest.mark.gpu
@pytest.mark.parametrize("problem", GPU_SAMPLED, ids=lambda p: p.op)
def test_gpu_the_sampled_reference_matches_the_full_one_and_a_tune_is_judged_on_it(problem, tmp_path, monkeypatch):
    from mla_core.accuracy import rel_l2
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    reference = mla_core.get_backend("reference")
    call = inputs.make_call(problem, "cuda")
    sample = tuner.head_sample(problem, call)
    cut = sample.take(tuner._outputs(reference.run(problem, call, {})))
    part = tuner._outputs(reference.run(sample.problem, sample.call, {}))
    # cuBLAS may pick other kernels for fewer heads: a last-bit difference may flip bf16 roundings; far inside 1e-2
    assert all(rel_l2(a, b) < 1e-3 for a, b in zip(part, cut))
    if problem.op == "merge":  # a real tune (merge: few configs that compile fast)
        result = tuner.tune(problem)
        assert result.winner is not None and f"on {sample.describe()} (tolerance" in result.check, result.check
