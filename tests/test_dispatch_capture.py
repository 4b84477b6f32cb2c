"""Dispatch remembers eager calls and CUDA-graph captures apart (``dispatch.capturing``): the cuda backend takes the
16-head eager decode step (one launch instead of triton's two: host time), triton keeps captured calls (GPU time).

CPU tests: fake backends on a CUDA ``Problem`` (no tensors, no GPU) with the capture state monkeypatched; the cuda
backend's rule through its ``priority_for``. GPU tests (``-m gpu``): ``mla_decode`` at 16 heads, batch 1, auto splits.
"""
import pytest
import torch

import mla_core
from mla_core import dispatch
from mla_core.plugins import registry

GRAPH_PRIORITY, EAGER_ONLY_PRIORITY, EAGER_PRIORITY = 200, 180, 210


class _Fake(mla_core.Backend):
    device_types = frozenset({"cuda", "cpu"})
    capabilities = {"decode": mla_core.OpCapability(features=frozenset({"lse"}))}

    def __init__(self):
        self.asked = 0

    def decode(self, call, config):
        raise AssertionError("dispatch tests never run a backend")


class GraphFast(_Fake):
    """A plugin written before capture states existed: ``priority_for(problem)`` ignores them (triton's place)."""

    name, priority = "cap_graph", GRAPH_PRIORITY

    def priority_for(self, problem):
        self.asked += 1
        return self.priority


class HostLight(_Fake):
    """Above GraphFast for eager calls only, read through ``dispatch.capturing`` (the cuda backend's place)."""

    name, priority = "cap_eager", EAGER_ONLY_PRIORITY

    def priority_for(self, problem):
        self.asked += 1
        return self.priority if dispatch.capturing(problem) else EAGER_PRIORITY


def _problem(device="cuda", **kw):
    return mla_core.Problem.make("decode", device, {"lse"}, **{"heads": 16, "batch": 1, "num_kv_splits": "auto",
                                                              **kw})


@pytest.fixture
def world(monkeypatch):
    """Only the two fakes are loaded, no choice source is asked (no cache file), and the capture state is
    ``state["capturing"]`` (CUDA counts as initialized)."""
    fakes = {"cap_graph": GraphFast(), "cap_eager": HostLight()}
    state = {"capturing": False}
    monkeypatch.setattr(registry(), "backends", dict(fakes))
    monkeypatch.setattr(dispatch, "_sources", [])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    dispatch.clear_memory()
    yield fakes, state
    dispatch.clear_memory()


def _choose(state, problem, capturing, explicit=None):
    state["capturing"] = capturing
    return dispatch.choose(problem, explicit)


def test_eager_and_captured_calls_are_ranked_and_remembered_apart(world):
    fakes, state = world
    problem = _problem()
    captured = _choose(state, problem, True)                  # a capture as the problem's first call
    assert (captured.backend.name, captured.source) == ("cap_graph", "priority")
    eager = _choose(state, problem, False)                    # not the captured choice remembered
    assert (eager.backend.name, eager.source) == ("cap_eager", "priority")
    asked = fakes["cap_eager"].asked
    for _ in range(3):                                        # each state answers from its own memory
        assert _choose(state, problem, True) is captured
        assert _choose(state, problem, False) is eager
    assert fakes["cap_eager"].asked == asked


def test_a_capture_of_a_problem_called_eagerly_replays_the_eager_choice(world):
    """The replay runs the kernels the eager calls ran (no backend's first launch, where Triton loads a module,
    lands inside the capture) and computes what they did."""
    fakes, state = world
    eager = _choose(state, _problem(), False)
    assert eager.backend.name == "cap_eager"
    assert _choose(state, _problem(), True) is eager
    assert _choose(state, _problem(batch=2), True).backend.name == "cap_graph"   # another key: its own decision


def test_a_problem_called_eagerly_asks_no_capture_state_again(world, monkeypatch):
    """The steady state (eager calls, and captures after them) is dict lookups: the stream is not asked."""
    fakes, state = world
    eager = _choose(state, _problem(), False)

    def never():
        raise AssertionError("asked the stream's capture state for a problem called eagerly")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", never)
    for _ in range(3):
        assert dispatch.choose(_problem()) is eager


def test_clear_memory_forgets_both_states(world):
    fakes, state = world
    problem = _problem()
    assert _choose(state, problem, True).backend.name == "cap_graph"
    assert _choose(state, problem, False).backend.name == "cap_eager"
    fakes["cap_eager"].priority, fakes["cap_graph"].priority = 300, 250   # the plugins changed ...
    dispatch.clear_memory()                                   # ... so both states decide again
    assert _choose(state, problem, True).backend.name == "cap_eager"
    assert _choose(state, problem, False).backend.name == "cap_graph"


def test_capturing_is_asked_only_for_cuda_problems_after_cuda_started(world, monkeypatch):
    fakes, state = world
    state["capturing"] = True
    assert dispatch.capturing(_problem()) is True
    assert dispatch.capturing(_problem("cpu")) is False       # a CPU call is never captured
    assert dispatch.choose(_problem("cpu")).backend.name == "cap_eager"

    def never():
        raise AssertionError("asked the stream before CUDA was initialized")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", never)
    assert dispatch.capturing(_problem()) is False            # no stream captures before CUDA starts
    assert dispatch.choose(_problem(batch=4)).backend.name == "cap_eager"


def test_a_plugin_whose_priority_for_takes_only_the_problem_ranks_the_same_in_both_states(world):
    fakes, state = world
    del registry().backends["cap_eager"]
    problem = _problem()
    assert _choose(state, problem, True).backend.name == _choose(state, problem, False).backend.name == "cap_graph"
    assert dispatch.priority_for(fakes["cap_graph"], problem) == (GRAPH_PRIORITY, None)


def test_choice_sources_and_overrides_win_in_both_states(world, monkeypatch):
    """A tuned cache entry (a choice source's answer) beats the priorities of both states, as an override does."""
    fakes, state = world
    tuned = dispatch.Choice(fakes["cap_graph"], {"tuned": 1}, "cache")
    monkeypatch.setattr(dispatch, "_sources", [lambda problem, valid: tuned])
    assert _choose(state, _problem(), False) is tuned
    assert _choose(state, _problem(batch=2), True) is tuned
    for capturing in (True, False):
        assert _choose(state, _problem(batch=4), capturing, "cap_eager").source == "override"


def _cuda_problem(**kw):
    base = dict(dtype="bfloat16", q_dtype="bfloat16", out_dtype="bfloat16", heads=16, kv_lora_rank=512, rope_dim=64,
                page_size=64, num_kv_splits="auto", k_qdq=None, v_qdq=None, p_qdq=None, batch=1, max_len=8192)
    base.update(kw)
    return mla_core.Problem.make("decode", "cuda", {"lse"}, **base)


@pytest.mark.parametrize("kw, eager_first, captured_first", [
    (dict(), True, False),                                    # the fused layer's decode step at TP 8
    (dict(batch=4, heads=8), True, False),
    (dict(batch=8), True, True),                              # from batch 8 WGMMA was faster in graphs too
    (dict(heads=128), True, True),
    (dict(num_kv_splits=32), False, False),                   # the API default: triton faster, eager or not
    (dict(k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4"), False, False),   # mma.sync's recipe
    (dict(p_qdq="fp8"), True, False)])
def test_cuda_priority_for_an_eager_16_head_decode_with_auto_splits(monkeypatch, kw, eager_first, captured_first):
    """cuda above triton (200) for an eager decode at <= 16 heads with auto splits below batch 8 (one launch:
    28.7 against 122.9 us of host time on the H200); below it while capturing (triton 2.4-4.7 us faster at L <= 4k)."""
    from mla_core_cuda import backend as cuda_backend
    cuda = cuda_backend.CudaBackend()
    triton_priority = mla_core.get_backend("triton").priority
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for capturing, first in ((False, eager_first), (True, captured_first)):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda capturing=capturing: capturing)
        assert (cuda.priority_for(_cuda_problem(**kw)) > triton_priority) == first, capturing
    assert cuda.priority < triton_priority


# --------------------------------------------------------------------------------------------------
# GPU


def _gpu_decode_inputs():
    from mla_core.inputs import decode_inputs
    cuda = mla_core.get_backend("cuda")
    args = decode_inputs([3000], heads=16, page_size=64, device="cuda", seed=3)
    problem, _ = mla_core.specs.validate_decode(
        args["q"], args["latent_cache"], args["block_table"], args["b_seq_len"], softmax_scale=args["softmax_scale"],
        kv_lora_rank=512, qk_rope_head_dim=64, page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None,
        v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    why = cuda.why_not(problem)
    if why:
        pytest.skip(f"cuda backend: {why}")
    return args


@pytest.fixture
def ran(monkeypatch):
    """Backend names in the order their decode ran (Backend.run looks the method up on the object); the priority
    rule decides (no cache entry, no override)."""
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")
    monkeypatch.delenv("MLA_CORE_BACKEND", raising=False)
    order = []
    for name in ("cuda", "triton"):
        backend = mla_core.get_backend(name)
        method = backend.decode
        monkeypatch.setattr(backend, "decode", lambda call, config, _m=method, _n=name: order.append(_n) or _m(call,
                                                                                                                config))
    dispatch.clear_memory()
    yield order
    dispatch.clear_memory()


def _capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out


def _rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu
def test_gpu_16_heads_batch_1_auto_eager_runs_cuda_and_a_first_capture_triton(ran):
    args = _gpu_decode_inputs()
    mla_core.mla_decode(**args, num_kv_splits="auto", backend="triton")   # loads Triton's kernels before a capture
    assert ran == ["triton"]
    graph, (captured, _) = _capture(lambda: mla_core.mla_decode(**args, num_kv_splits="auto"))
    assert ran == ["triton", "triton"]                        # the capture is the problem's first automatic call
    eager, _ = mla_core.mla_decode(**args, num_kv_splits="auto")
    assert ran == ["triton", "triton", "cuda"]
    graph.replay()
    torch.cuda.synchronize()
    assert not captured.isnan().any() and _rel_l2(captured, eager) < 1e-2
    mla_core.mla_decode(**args, num_kv_splits="auto")
    assert ran[-1] == "cuda"


@pytest.mark.gpu
def test_gpu_a_capture_after_eager_calls_replays_the_eager_choice(ran):
    args = _gpu_decode_inputs()
    eager, _ = mla_core.mla_decode(**args, num_kv_splits="auto")
    graph, (captured, _) = _capture(lambda: mla_core.mla_decode(**args, num_kv_splits="auto"))
    assert ran == ["cuda", "cuda"]
    graph.replay()
    torch.cuda.synchronize()
    assert _rel_l2(captured, eager) < 1e-6                  # the same kernel (triton's differs by ~1e-3)
