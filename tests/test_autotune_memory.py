"""The tuner's memory across shapes: nothing a tuned shape allocated outlives it into the next one (refcounts only,
as on a GPU, where the garbage collector never sees device bytes), and on a GPU the caching allocator's cached
memory, dead CUDA graphs' pools included, goes back to the device (the TP 1 warm-up's out-of-memory)."""
import gc
import math
import weakref

import pytest
import torch

import autotune_fakes as fakes
import mla_core
from mla_core import inputs
from mla_core.autotune import tuner, warmup
from mla_core.plugins import registry
from mla_core.problem import Problem
from mla_core_reference.backend import ReferenceBackend


def _prefill(features=(), q=64, k=128):
    return Problem.make("prefill", "cpu", features, dtype="bfloat16", heads=8, kv_heads=8, qk_dim=192, v_dim=128,
                        causal=1, q_quant=None, k_quant=None, p_quant=None, v_quant=None, block_n=64, sparsity_m=0,
                        batch=1, dense_batch=1, max_seqlen_q=q, total_k=k)


class _Prefill(mla_core.Backend):
    """The reference's prefill as a candidate; ``fail``: it allocates, then raises (its frames hold the tensor)."""

    name, version, device_types = "tt_mem_prefill", "1", frozenset({"cpu"})
    capabilities = {"prefill": mla_core.OpCapability(features=frozenset({"lse"}))}
    fail = False

    def configs(self, problem):
        return [{}]

    def prefill(self, call, config):
        from mla_core_reference.prefill import mla_prefill_reference
        if self.fail:
            scratch = torch.empty(1 << 16)
            _Tracker.current.track("a failing candidate's scratch", scratch)
            raise RuntimeError("this candidate fails")
        return mla_prefill_reference(call)


class _Failing(_Prefill):
    name, fail = "tt_mem_failing", True


class _Tracker:
    """Weak references to what each shape of a warm-up allocates, and what of the earlier shapes is still alive when
    a shape builds its inputs (before anything of its own exists)."""

    current = None

    def __init__(self):
        self.shape, self.refs, self.alive_at_start = -1, [], {}
        _Tracker.current = self

    def track(self, label, obj):
        self.refs.append((self.shape, label, weakref.ref(obj)))

    def alive(self, before=None):
        return sorted({f"#{shape} {label}" for shape, label, ref in self.refs
                       if ref() is not None and (before is None or shape < before)})


def test_nothing_a_tuned_shape_allocated_lives_on_into_the_next(fake_world, monkeypatch):
    """Inputs, candidates' and the reference's outputs, captured graphs (stand-ins holding a tensor, as a graph holds
    its pool), a failing candidate's and a failed capture's tensors: all dead when the next shape builds its inputs,
    except the kept prefill reference for its LSE twin, and nothing at all after the warm-up."""
    track = _Tracker()
    real_make_call, real_checked_run, real_tune = inputs.make_call, tuner._checked_run, tuner.tune

    def make_call(problem, device=None, seed=0):
        if seed == 0:
            track.alive_at_start[track.shape] = track.alive(before=track.shape)
        call = real_make_call(problem, device, seed)
        for name in ("q", "k", "v", "prefix_output", "suffix_output"):
            if isinstance(getattr(call, name, None), torch.Tensor):
                track.track(f"input {name}", getattr(call, name))
        return call

    def checked_run(backend, problem, call, config):
        out = real_checked_run(backend, problem, call, config)
        for t in out:
            track.track("reference" if backend.name in ("reference", "tt_exact") else "output", t)
        return out

    class Graph:
        def __init__(self):
            self.pool = torch.empty(1 << 16)

    def capture(step, steps, device):
        step()
        graph = Graph()
        track.track("graph", graph)
        if track.shape == 2:  # a capture that fails, its cause's traceback holding the graph and the calls
            try:
                raise RuntimeError("operation not permitted when stream is capturing")
            except RuntimeError as exc:
                raise tuner.GraphCaptureError("capture failed") from exc
        return graph

    def tune(problem, **kwargs):
        track.shape += 1
        if problem.op == "merge":
            return real_tune(problem, [fake_world["tt_fast"], fake_world["tt_wrong"]], warmup=2, repeats=1)
        return real_tune(problem, [_Prefill(), _Failing()], reference="reference", warmup=2, repeats=1)

    monkeypatch.setattr(inputs, "make_call", make_call)
    monkeypatch.setattr(tuner, "_checked_run", checked_run)
    monkeypatch.setattr(tuner, "_graphs", lambda device: True)
    monkeypatch.setattr(tuner, "capture", capture)
    monkeypatch.setattr(tuner, "_graph_us", lambda graph, steps, repeats, target_s: 0.5)
    monkeypatch.setattr(tuner, "tune", tune)
    monkeypatch.setattr(tuner, "_shared_reference", None)
    monkeypatch.setattr(warmup, "_only_candidate", lambda problem: None)
    monkeypatch.setitem(registry().backends, "reference", ReferenceBackend())  # the prefill judge
    problems = [_prefill(), _prefill({"lse"}), fakes.merge_problem(), _prefill(q=32, k=64)]
    enabled = gc.isenabled()
    gc.disable()
    try:
        with pytest.warns(tuner.AutotuneWarning, match="rejected tt_wrong"):
            rows = warmup.run(problems, force=True)
        after = track.alive()
    finally:
        if enabled:
            gc.enable()
    assert [r.status for r in rows] == ["tuned"] * 4, [r.note for r in rows]
    labels = {label for _, label, _ in track.refs}
    assert {"input q", "input prefix_output", "output", "reference", "graph", "a failing candidate's scratch"} <= labels
    assert track.alive_at_start == {0: [], 1: ["#0 reference"], 2: [], 3: []}
    assert after == []


def test_a_warm_up_returns_each_shapes_memory_failed_ones_too(fake_world, monkeypatch):
    released = []
    real_tune = tuner.tune

    def tune(problem, **kwargs):
        if problem["tokens"] == 128:
            raise RuntimeError("CUDA error: out of memory")
        return real_tune(problem, [fake_world["tt_fast"]], warmup=1, repeats=1)

    monkeypatch.setattr(tuner, "tune", tune)
    monkeypatch.setattr(tuner, "release_memory", lambda device_type, collect=False: released.append((device_type,
                                                                                                     collect)))
    monkeypatch.setattr(warmup, "_only_candidate", lambda problem: None)
    rows = warmup.run([fakes.merge_problem(), fakes.merge_problem(tokens=128), fakes.merge_problem(tokens=32)],
                      force=True)
    assert [r.status for r in rows] == ["tuned", "failed", "tuned"]
    # each tune returns its own memory; a shape that raised gets the collector too; the warm-up's end once more
    assert released == [("cpu", False), ("cpu", True), ("cpu", False), ("cpu", False)]


# ------------------------------------------------------------------------------------------------
# on the device: dead graphs' pools and the default pool's free blocks go back before captures and between shapes

SCRATCH = 256 << 20


def _scratch_backends():
    """A capturable GPU merge with four configs whose every call also writes a SCRATCH-byte workspace (each captured
    graph's private pool holds one); and its judge."""

    class Scratch(fakes.Exact):
        name, sleep_s, device_types = "tt_gpu_scratch", 0.0, frozenset({"cuda"})

        def configs(self, problem):
            return [{"variant": i} for i in range(4)]

        def merge(self, call, config):
            torch.empty(SCRATCH // 4, device=call.prefix_lse.device).fill_(1.0)
            return fakes.merge_math(call)

    class Judge(fakes.Exact):
        name, sleep_s, device_types = "tt_gpu_judge", 0.0, frozenset({"cuda"})

    return Scratch(), Judge()


def _gpu_merge(tokens=64):
    return Problem.make("merge", "cuda", dtype="float32", out_dtype="float32", heads=4, head_dim=32, tokens=tokens)


@pytest.fixture
def scratch_world(fake_world, monkeypatch):
    """The scratch backend and its judge; ``reserved``: ``torch.cuda.memory_reserved()`` as each capture begins."""
    scratch, judge = _scratch_backends()
    monkeypatch.setitem(registry().backends, judge.name, judge)
    monkeypatch.setattr(tuner, "PRUNE_FACTOR", math.inf)  # every candidate captured
    reserved, real_capture = [], tuner.capture
    monkeypatch.setattr(tuner, "capture", lambda step, steps, device: reserved.append(torch.cuda.memory_reserved())
                        or real_capture(step, steps, device))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return scratch, judge, reserved


@pytest.mark.gpu
@pytest.mark.parametrize("headroom", [0.0, 1.0])
def test_gpu_a_capture_finds_dead_graphs_pools_released_when_memory_is_short(scratch_world, monkeypatch, headroom):
    """The cause of the TP 1 warm-up's out-of-memory, and its fix. With no headroom asked (0.0: never released), each
    dead graph's pool stays reserved through the next captures (a capture cannot release it); asking for all of it
    (1.0: the device is always short) releases them before every capture, so the reserved memory stays flat."""
    scratch, judge, reserved = scratch_world
    monkeypatch.setattr(tuner, "CAPTURE_HEADROOM", headroom)
    result = tuner.tune(_gpu_merge(), [scratch], reference=judge.name, timing="graph")
    assert result.winner is not None and len(reserved) == 4
    growth = max(reserved) - min(reserved)
    if headroom == 0.0:
        assert growth >= 2 * SCRATCH, reserved
    else:
        assert growth < SCRATCH // 2, reserved


@pytest.mark.gpu
def test_gpu_two_shapes_back_to_back_leave_the_device_as_they_found_it(scratch_world, monkeypatch):
    """Four captures per shape; the second shape's first capture does not find the first shape's dead pools still
    reserved, and after the warm-up the device holds what it held before (tensors and cache)."""
    scratch, judge, reserved = scratch_world
    real_tune = tuner.tune
    monkeypatch.setattr(tuner, "tune", lambda problem, **kw: real_tune(problem, [scratch], reference=judge.name,
                                                                        timing="graph"))
    monkeypatch.setattr(warmup, "_only_candidate", lambda problem: None)
    allocated, cached = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    rows = warmup.run([_gpu_merge(64), _gpu_merge(128)], force=True)
    assert [r.status for r in rows] == ["tuned", "tuned"] and len(reserved) == 8
    assert reserved[4] < reserved[0] + SCRATCH // 2, reserved
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= allocated + (1 << 20)
    assert torch.cuda.memory_reserved() <= cached + (64 << 20)
