"""Autotuner: timing every (backend, config), rejecting fast-but-wrong backends, lookup order, modes, capture."""
import math
import time

import pytest
import torch

import autotune_fakes as fakes
import mla_core
from mla_core import dispatch, inputs
from mla_core.autotune import cache, tuner, warmup
from mla_core.problem import Problem


def _merge_args(tokens=64, heads=4, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(prefix_output=torch.randn(tokens, heads, dim, generator=g), prefix_lse=torch.randn(heads, tokens, generator=g),
                suffix_output=torch.randn(tokens, heads, dim, generator=g), suffix_lse=torch.randn(heads, tokens, generator=g))


def _no_tuning(*args, **kwargs):
    raise AssertionError("the tuner ran")


def test_tune_times_every_candidate_and_rejects_fast_wrong(fake_world):
    problem = fakes.merge_problem()
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_wrong"):
        result = tuner.tune(problem, list(fake_world.values()))
    assert [(c.backend, c.config) for c in result.candidates] == [
        ("tt_slow", {}), ("tt_fast", {"sleep_s": 0.006}), ("tt_fast", {"sleep_s": 0.001}), ("tt_wrong", {}),
        ("tt_exact", {})]
    assert all(c.us is not None and c.us > 0 for c in result.candidates)
    # the slowest candidate, timed after faster ones, stops after its warm-up (its time is an estimate)
    assert next(c for c in result.candidates if c.backend == "tt_exact").note.startswith("warm-up estimate")
    assert (result.winner.backend, result.winner.config) == ("tt_fast", {"sleep_s": 0.001})
    assert result.default.backend == "tt_slow" and result.speedup > 2
    assert [r["backend"] for r in result.rejected] == ["tt_wrong"] and "differs" in result.rejected[0]["reason"]
    assert result.runner_up.backend == "tt_fast" and result.runner_up.config == {"sleep_s": 0.006}
    entry = result.entry()
    assert entry["versions"]["backend"] == "1" and entry["versions"]["torch"] == torch.__version__
    assert len(entry["candidates"]) == 5 and entry["rejected"][0]["backend"] == "tt_wrong"
    # each candidate's tuning seconds: tt_slow sleeps 16 ms a call and makes at least its 3 warm-up calls
    seconds = {(c["backend"], c["config"].get("sleep_s")): c["s"] for c in entry["candidates"]}
    assert seconds[("tt_slow", None)] >= 3 * 0.016 and all(s > 0 for s in seconds.values())


def test_on_a_gpu_the_reference_is_timed_only_when_every_other_candidate_fails(fake_world, monkeypatch):
    monkeypatch.setattr(tuner, "DEFER_REFERENCE_ON", frozenset({"cpu"}))  # the GPU rule, on this CPU
    problem = fakes.merge_problem()  # tt_exact (exact math, the slowest) judges, as the reference backend does
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_wrong"):
        result = tuner.tune(problem, list(fake_world.values()), reference="tt_exact")
    assert "tt_exact" not in {c.backend for c in result.candidates}
    assert (result.winner.backend, result.winner.config) == ("tt_fast", {"sleep_s": 0.001})
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_wrong"):
        fallback = tuner.tune(problem, [fake_world["tt_wrong"], fake_world["tt_exact"]], reference="tt_exact")
    assert [c.backend for c in fallback.candidates] == ["tt_wrong", "tt_exact"]
    assert fallback.winner.backend == "tt_exact" and "every other candidate" in fallback.check
    assert fallback.default.backend == "tt_wrong"


def test_failing_candidate_is_recorded_not_fatal(fake_world):
    class Crash(fakes.Fast):
        name = "tt_crash"

        def merge(self, call, config):
            raise RuntimeError("kernel launch failed")

    result = tuner.tune(fakes.merge_problem(), [Crash(), fake_world["tt_slow"]])
    assert result.winner.backend == "tt_slow"
    assert all("kernel launch failed" in c.error for c in result.candidates if c.backend == "tt_crash")


def test_dispatch_tunes_on_miss_with_mode_on_then_uses_memory_then_disk(fake_world, monkeypatch):
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "on")
    args = _merge_args()
    with pytest.warns(tuner.AutotuneWarning):
        out, lse = mla_core.merge_attn_states(**args)
    ref_out, ref_lse = fakes.merge_math(type("C", (), {**args, "output": None})())
    torch.testing.assert_close(out, ref_out)
    problem = fakes.merge_problem()
    choice = dispatch.choose(problem)
    assert (choice.backend.name, choice.config, choice.source) == ("tt_fast", {"sleep_s": 0.001}, "tuned")
    # after the first call the key is an in-memory lookup: neither the tuner nor the cache is asked again
    with monkeypatch.context() as m:
        m.setattr(dispatch, "_sources", [_no_tuning])
        assert dispatch.choose(problem) is choice
    # a new process (empty memory) finds the choice on disk without tuning
    monkeypatch.setattr(tuner, "tune", _no_tuning)
    dispatch.clear_memory()
    choice = dispatch.choose(problem)
    assert (choice.backend.name, choice.source) == ("tt_fast", "cache")


def test_default_mode_is_cached_and_never_tunes(fake_world, monkeypatch):
    assert tuner.mode() == "cached"
    monkeypatch.setattr(tuner, "tune", _no_tuning)
    assert dispatch.choose(fakes.merge_problem()).source == "priority"
    mla_core.merge_attn_states(**_merge_args())


def _store(problem, backend, config, version_changes=None):
    dev = cache.device_name(problem.device)
    versions = {**cache.versions(backend, dev), **(version_changes or {})}
    cache.store(dev, {problem.key(): {"backend": backend.name, "config": config, "versions": versions}})


def test_lookup_order_user_then_shipped_then_priority(fake_world, monkeypatch, tmp_path):
    problem = fakes.merge_problem()
    ship = tmp_path / "shipped"
    ship.mkdir()
    shipped = {problem.key(): {"backend": "tt_fast", "config": {"sleep_s": 0.006},
                               "versions": cache.versions(fake_world["tt_fast"], "cpu")}}
    (ship / "cpu.json").write_text(cache.dump("cpu", shipped))
    monkeypatch.setattr(cache, "shipped_dir", lambda: ship)
    choice = dispatch.choose(problem)
    assert (choice.backend.name, choice.config, choice.source) == ("tt_fast", {"sleep_s": 0.006}, "shipped")
    _store(problem, fake_world["tt_exact"], {})
    dispatch.clear_memory()
    assert (dispatch.choose(problem).backend.name, dispatch.choose(problem).source) == ("tt_exact", "cache")
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")  # off: priority rule only, caches not read
    dispatch.clear_memory()
    assert dispatch.choose(problem).source == "priority"


def test_entries_from_other_versions_are_ignored(fake_world):
    problem = fakes.merge_problem()
    _store(problem, fake_world["tt_fast"], {}, {"torch": "1.0.0"})
    _store(fakes.merge_problem(tokens=128), fake_world["tt_fast"], {}, {"backend": "tt_fast 0"})
    assert dispatch.choose(problem).source == "priority"
    assert dispatch.choose(fakes.merge_problem(tokens=128)).source == "priority"


def test_never_tunes_during_cuda_graph_capture(fake_world, monkeypatch):
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "on")
    monkeypatch.setattr(tuner, "capturing", lambda device_type: True)
    monkeypatch.setattr(tuner, "measure", _no_tuning)
    assert tuner.tuned_choice(fakes.merge_problem(), list(fake_world.values())) is None
    with pytest.raises(RuntimeError, match="graph capture"):
        tuner.tune(fakes.merge_problem(), list(fake_world.values()))


def test_unknown_mode_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "sometimes")
    with pytest.raises(mla_core.MLAInputError, match="MLA_CORE_AUTOTUNE='sometimes'.*off | cached"):
        tuner.mode()


def _decode_problem(splits, p_qdq="fp8", max_len=256):
    return Problem.make("decode", "cpu", {"lse"}, dtype="float32", q_dtype="float32", out_dtype="float32", heads=4,
                        kv_lora_rank=64, rope_dim=16, page_size=16, num_kv_splits=splits, k_qdq=None, v_qdq=None,
                        p_qdq=p_qdq, batch=2, max_len=max_len)


def test_split_count_is_tuned_only_on_auto():
    class Tiles(mla_core.Backend):
        name = "tt_tiles"

        def configs(self, problem):
            return [{"block": 32}, {"block": 64, "num_kv_splits": 4}]

    auto = tuner.candidate_configs(Tiles(), _decode_problem("auto", max_len=256))  # 8 tiles of 32 keys
    assert {"block": 32, "num_kv_splits": 8} in auto and {"block": 64, "num_kv_splits": 4} in auto
    assert all("num_kv_splits" in c for c in auto) and max(c["num_kv_splits"] for c in auto) == 8
    fixed = tuner.candidate_configs(Tiles(), _decode_problem(32))
    assert fixed == [{"block": 32}, {"block": 64}]  # the caller's count is part of the problem: never tuned


def test_inputs_rebuild_exactly_their_problem():
    small = [
        _decode_problem("auto"), _decode_problem(8, p_qdq="nvfp4"),
        Problem.make("prefill", "cpu", {"lse", "nm_sparsity", "gqa"}, dtype="float32", heads=4, kv_heads=2, qk_dim=48,
                     v_dim=32, causal=1, q_quant=None, k_quant="fp8", p_quant="nvfp4", v_quant="nvfp4", block_n=32,
                     sparsity_m=8, batch=2, max_seqlen_q=32, total_k=64),
        fakes.merge_problem(),
        Problem.make("merge", "cpu", dtype="bfloat16", out_dtype="float32", heads=2, head_dim=16, tokens=8),
        Problem.make("rope_quantize_fp8", "cpu", dtype="bfloat16", cos_dtype="float32", heads=2, rope_dim=16,
                     nope_dim=32, neox=0, tokens=16),
        Problem.make("sparse_decode", "cpu", {"lse"}, heads=2, q_len=1, top_k=64, kv_lora_rank=512, rope_dim=64, batch=2,
                     kv_layout="fp8"),
    ]
    preset = warmup.preset_problems(warmup.Grid(tp=(8,), batches=(1,), lengths=(1024,), prefill_lengths=(64,),
                                                prefill_cached=(0, 64), device="cpu"))
    assert len(preset) == 3 * 5 + 1  # per recipe: decode, prefill fresh / after a prefix, each +-lse; one merge
    for problem in small + preset:
        call = inputs.make_call(problem, "cpu", seed=1)
        assert inputs.call_nbytes(call) > 0
    with pytest.raises(inputs.ProblemInputsError):
        inputs.make_call(_decode_problem(32, max_len=8), "cpu")  # a 16-token page cannot make an 8-token bucket


def test_a_long_call_is_timed_in_three_samples_not_seven():
    """Over ~1.4 ms a call gets fewer samples (at least 3, ~10 ms in all): 3 warm-up calls + 3 samples of one call."""
    calls = []
    m = tuner.measure(lambda c: (calls.append(c), time.sleep(0.03)), [0], torch.device("cpu"), warmup=3, repeats=7)
    assert len(calls) == 6 and m.us >= 30_000 and m.timing == "eager"


def test_inputs_of_a_quantized_problem_share_one_calibration_across_sets():
    """Every input set passes the same amax (Triton kernels specialize on the scales: a per-set amax recompiled
    mid-timing, 2-3 s per candidate on the H200) and holds no value above it."""
    decode = Problem.make("decode", "cpu", {"lse"}, dtype="bfloat16", q_dtype="bfloat16", out_dtype="bfloat16",
                          heads=4, kv_lora_rank=64, rope_dim=16, page_size=16, num_kv_splits=4, k_qdq="fp8",
                          v_qdq="nvfp4", p_qdq="fp8", batch=2, max_len=256)
    prefill = Problem.make("prefill", "cpu", {"lse"}, dtype="bfloat16", heads=4, kv_heads=4, qk_dim=48, v_dim=32,
                           causal=1, q_quant="fp8", k_quant="fp8", p_quant=None, v_quant="nvfp4", block_n=32,
                           sparsity_m=0, batch=2, max_seqlen_q=32, total_k=64)
    for problem, operands in ((decode, {"k_amax": "latent_cache", "v_amax": "latent_cache"}),
                              (prefill, {"q_amax": "q", "k_amax": "k", "v_amax": "v"})):
        calls = [inputs.make_call(problem, "cpu", seed) for seed in range(6)]
        for amax, tensor in operands.items():
            assert {getattr(c, amax) for c in calls} == {inputs.CALIBRATED_AMAX}
            assert all(float(getattr(c, tensor).abs().max()) <= inputs.CALIBRATED_AMAX for c in calls)
    plain = inputs.make_call(_decode_problem(4, p_qdq=None), "cpu")
    assert plain.k_amax is None and plain.v_amax is None


def test_auto_splits_are_checked_against_the_reference_at_the_same_count(monkeypatch, tmp_path):
    """With P quantized the split count changes results: a tuned count is judged against the reference at that count."""
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    reference = mla_core.get_backend("reference")
    splits_seen = []

    class SplitDecode(mla_core.Backend):
        name, device_types = "tt_split_decode", frozenset({"cpu"})
        capabilities = {"decode": mla_core.OpCapability(features=frozenset({"lse"}))}

        def configs(self, problem):
            return [{}]

        def decode(self, call, config):
            import dataclasses
            splits_seen.append(config["num_kv_splits"])
            return reference.decode(dataclasses.replace(call, num_kv_splits=config["num_kv_splits"]), {})

    problem = _decode_problem("auto", p_qdq="fp8", max_len=128)  # 4 tiles: splits 1, 2, 4 change P's running max
    result = tuner.tune(problem, [SplitDecode()], warmup=1, repeats=1)
    assert sorted(set(splits_seen)) == [1, 2, 4]
    assert result.winner is not None and not result.rejected, result.rejected
    assert "num_kv_splits" in result.winner.config and "against reference" in result.check


def test_json_collectives_on_one_gloo_rank(tmp_path, monkeypatch):
    """all_gather_json / sync move JSON bytes in uint8 tensors (never pickles); one rank keeps the test cheap
    (tests/test_autotune_distributed.py runs two)."""
    import torch.distributed as dist
    monkeypatch.setattr(dist, "broadcast_object_list", _no_tuning)
    monkeypatch.setattr(dist, "all_gather_object", _no_tuning)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        value = {"key": [1, "two", None, 3.5], "ünïcode": True}
        assert tuner.all_gather_json(value) == [value]
        assert tuner.all_gather_json("") == [""]
        assert tuner._broadcast_bytes(b"{}", 0) == b"{}"
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# timing kinds: CUDA-graph replays where a candidate can be captured, eager calls otherwise (MLA_CORE_TUNE_TIMING)


@pytest.mark.parametrize("value,mode", [("", "auto"), ("auto", "auto"), ("GRAPH", "graph"), (" eager ", "eager")])
def test_timing_mode_reads_the_variable(monkeypatch, value, mode):
    monkeypatch.setenv("MLA_CORE_TUNE_TIMING", value)
    assert tuner.timing_mode() == mode


def test_unknown_timing_is_an_error_naming_the_variable(fake_world, monkeypatch):
    from mla_core import env
    monkeypatch.setenv("MLA_CORE_TUNE_TIMING", "sometimes")
    with pytest.raises(mla_core.MLAInputError, match="MLA_CORE_TUNE_TIMING='sometimes'.*auto"):
        tuner.tune(fakes.merge_problem(), list(fake_world.values()))
    assert any("MLA_CORE_TUNE_TIMING" in p for p in env.problems())
    with pytest.raises(mla_core.MLAInputError, match="timing='fast'"):
        tuner.tune(fakes.merge_problem(), list(fake_world.values()), timing="fast")


def test_cpu_timing_is_eager_whatever_the_mode(fake_world, monkeypatch):
    monkeypatch.setenv("MLA_CORE_TUNE_TIMING", "graph")  # the CPU has no graphs: graph mode times eagerly there
    monkeypatch.setattr(tuner, "capture", _no_tuning)
    problem = fakes.merge_problem()
    with pytest.warns(tuner.AutotuneWarning):
        result = tuner.tune(problem, [fake_world[n] for n in ("tt_fast", "tt_wrong")])
    assert {c.timing for c in result.candidates} == {"eager"}
    entry = result.entry()
    assert entry["timing"] == "eager" and all(c["timing"] == "eager" for c in entry["candidates"])
    assert "capture_error" not in entry["candidates"][0]


class _Captures:
    """Stands in for ``tuner.capture`` on the CPU: records each capture; a backend named in ``refuse`` fails it."""

    def __init__(self, refuse=()):
        self.refuse, self.steps = set(refuse), []

    def __call__(self, step, steps, device):
        self.steps.append(steps)
        step()  # the captured calls are the candidate's own
        if self.backend in self.refuse:
            raise tuner.GraphCaptureError("capture failed: RuntimeError: operation not permitted when stream is capturing")
        return "graph"


@pytest.fixture
def fake_graphs(monkeypatch):
    """The tuner believes it can capture on the CPU; a graph replay 'takes' 0.5 us per call (far under any
    warm-up call of the fakes, so pruning must compare warm-up calls, not medians of different kinds)."""
    captures = _Captures()
    monkeypatch.setattr(tuner, "_graphs", lambda device: True)
    monkeypatch.setattr(tuner, "capture", captures)
    monkeypatch.setattr(tuner, "_graph_us", lambda graph, steps, repeats, target_s: 0.5)
    original = tuner.measure

    def measure(run, calls, device, *args, **kwargs):
        captures.backend = run.__defaults__[0].name  # the backend the tuner's lambda binds
        return original(run, calls, device, *args, **kwargs)

    monkeypatch.setattr(tuner, "measure", measure)
    return captures


def test_auto_times_capturable_candidates_in_a_graph_and_the_others_eagerly(fake_world, fake_graphs):
    fake_graphs.refuse = {"tt_slow"}
    result = tuner.tune(fakes.merge_problem(), list(fake_world.values()), timing="auto")
    by = {(c.backend, c.config.get("sleep_s")): c for c in result.candidates}
    slow = by[("tt_slow", None)]
    assert slow.timing == "eager" and "not permitted when stream is capturing" in slow.capture_error
    assert slow.error is None and slow.us > 1000  # timed eagerly: its 16 ms sleep counts
    fast = [by[("tt_fast", 0.006)], by[("tt_fast", 0.001)]]
    assert all(c.timing == "graph" and c.us == 0.5 and c.capture_error is None and c.note is None for c in fast)
    assert result.entry()["timing"] == "graph"
    assert all(steps >= 1 for steps in fake_graphs.steps)


def test_graph_mode_fails_a_candidate_that_cannot_be_captured(fake_world, fake_graphs):
    fake_graphs.refuse = {"tt_slow"}
    result = tuner.tune(fakes.merge_problem(), list(fake_world.values()), timing="graph")
    slow = next(c for c in result.candidates if c.backend == "tt_slow")
    assert slow.us is None and slow.error.startswith("GraphCaptureError: capture failed")
    assert result.winner.backend == "tt_fast" and result.winner.timing == "graph"


def test_eager_mode_never_captures(fake_world, fake_graphs, monkeypatch):
    monkeypatch.setenv("MLA_CORE_TUNE_TIMING", "eager")
    with pytest.warns(tuner.AutotuneWarning):
        result = tuner.tune(fakes.merge_problem(), list(fake_world.values()))
    assert fake_graphs.steps == [] and {c.timing for c in result.candidates} == {"eager"}


def test_old_entries_without_timing_still_load_and_show():
    from mla_core.autotune.warmup import Row, us_cell
    entry = {"backend": "tt_fast", "config": {}, "us": 12.0, "versions": {},
             "candidates": [{"backend": "tt_fast", "config": {}, "us": 12.0}, {"backend": "tt_slow", "config": {}, "us": 30.0}]}
    assert cache.entry_problem(entry) is None
    row = Row(fakes.merge_problem(), "cached", entry).as_dict()
    assert row["timing"] is None and row["runner_up_timing"] is None and row["runner_up_us"] == 30.0
    assert us_cell(12.0, None) == "12.0" and us_cell(12.04, "graph") == "12.0 graph" and us_cell(None, "eager") == "-"


def _gpu_fakes():
    """Fake merge backends on the GPU: one capturable, one that reads the host (a sync: the capture is invalidated
    and ``capture_end`` raises), one that raises while capturing (the capture itself stays valid)."""

    class Plain(fakes.Exact):
        name, sleep_s, device_types = "tt_gpu_plain", 0.0, frozenset({"cuda"})

    class HostRead(Plain):
        name = "tt_gpu_host"

        def merge(self, call, config):
            float(call.prefix_lse.sum())
            return fakes.merge_math(call)

    class Refuses(Plain):
        name = "tt_gpu_refuses"

        def merge(self, call, config):
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("this backend cannot be captured")
            return fakes.merge_math(call)

    return Plain(), HostRead(), Refuses()


def _capture_still_works():
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    x = torch.arange(4.0, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2  # warm-up on the side stream, as torch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    x.add_(1)
    graph.replay()
    torch.testing.assert_close(y, (torch.arange(4.0, device="cuda") + 1) * 2)


@pytest.mark.gpu
def test_gpu_capturable_candidates_are_timed_in_a_graph_and_failed_captures_leave_no_broken_state(fake_world,
                                                                                                     monkeypatch):
    from mla_core.plugins import registry
    plain, host, refuses = _gpu_fakes()
    judge = type(plain)()
    judge.name = "tt_gpu_judge"  # a judge outside the candidates: on a GPU the judge itself is timed last (deferred)
    # no pruning: a call right after a failed capture can be slow enough to be cut off as a warm-up estimate
    # (timed "eager"), which is the pruning rule's business, not what this test is about
    monkeypatch.setattr(tuner, "PRUNE_FACTOR", math.inf)
    monkeypatch.setitem(registry().backends, plain.name, plain)
    monkeypatch.setitem(registry().backends, judge.name, judge)
    problem = Problem.make("merge", "cuda", dtype="float32", out_dtype="float32", heads=4, head_dim=32, tokens=64)
    result = tuner.tune(problem, [host, plain, refuses, plain], reference=judge.name, timing="auto")
    by = [(c.backend, c.timing, c.capture_error, c.error) for c in result.candidates]
    assert [b[:2] for b in by] == [("tt_gpu_host", "eager"), ("tt_gpu_plain", "graph"), ("tt_gpu_refuses", "eager"),
                                   ("tt_gpu_plain", "graph")], by
    assert by[0][2].startswith("capture failed") and "cannot be captured" in by[2][2]
    assert all(b[3] is None for b in by) and result.winner.timing in ("graph", "eager")
    _capture_still_works()
    strict = tuner.tune(problem, [host, plain], reference=plain.name, timing="graph")
    assert strict.candidates[0].error.startswith("GraphCaptureError") and strict.winner.backend == plain.name
    _capture_still_works()
    before = torch.cuda.memory_allocated()
    for _ in range(3):  # failed captures do not keep memory
        tuner.tune(problem, [host, refuses], reference=plain.name, timing="auto")
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + (1 << 20)
    _capture_still_works()


@pytest.mark.gpu
def test_gpu_a_real_kernel_is_timed_in_a_graph_faster_than_eager():
    """The triton merge kernel at a small shape: host-bound when called eagerly, so its graph time is lower."""
    triton = mla_core.backends()["triton"]
    problem = Problem.make("merge", "cuda", dtype="bfloat16", out_dtype="bfloat16", heads=16, head_dim=128, tokens=64)
    calls = [inputs.make_call(problem, "cuda", seed) for seed in range(4)]
    config = triton.configs(problem)[0]
    device = torch.device("cuda", torch.cuda.current_device())
    graph = tuner.measure(lambda c: triton.run(problem, c, config), calls, device, timing="graph")
    eager = tuner.measure(lambda c: triton.run(problem, c, config), calls, device, timing="eager")
    assert (graph.timing, graph.capture_error, eager.timing) == ("graph", None, "eager")
    assert 0 < graph.us < eager.us, (graph, eager)
    _capture_still_works()
