"""Autotuner: time every valid ``(backend, config)`` of a problem, keep the fastest correct one.

Dispatch asks :data:`CHOICE_SOURCES` in order on an in-memory miss: the user cache, then the shipped
``autotune_cache/`` files (:mod:`mla_core.autotune.cache`), then -- only with ``MLA_CORE_AUTOTUNE=on``
and never during CUDA graph capture -- a fresh :func:`tune`; none answering lets dispatch apply the
priority rule.

``MLA_CORE_AUTOTUNE``: ``off`` (priority rule only; caches not read), ``cached`` (default: use cached
choices, never tune implicitly; ``mla-core warmup`` fills the cache), ``on`` (tune on a miss).

Tuning builds random inputs of the problem's shape on its device (:func:`mla_core.inputs.make_call`), rotating
through enough copies that together they overflow the L2 cache; each candidate is warmed up, then
timed in several repeats and its median per-call time kept: on a GPU as replays of a CUDA graph of
its calls (how serving engines run decode) when it can be captured, else as eager calls, both with
CUDA events (``MLA_CORE_TUNE_TIMING``); on the CPU eager calls by ``perf_counter``. The fastest
candidate's output is compared once with the reference backend's on the same inputs (on a sample of heads,
the only ones the reference runs: :func:`head_sample`); a fast but wrong candidate is rejected (warning, and
recorded) and the next one is checked. A tune leaves nothing of its problem on the device: its inputs, outputs and
graphs die with it and :func:`release_memory` returns the cached memory (:data:`CAPTURE_HEADROOM` says why).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from .. import env, inputs, plugins, specs
from ..accuracy import REFERENCE as REFERENCE_BACKEND, compare, tolerance
from ..dispatch import Choice
from ..errors import MLAInputError
from ..problem import Problem
from . import cache

if TYPE_CHECKING:
    from ..backend import Backend

ENV_MODE = env.AUTOTUNE
MODES = env.AUTOTUNE_MODES
DEFAULT_MODE = "cached"
REFERENCE = REFERENCE_BACKEND
SPLIT_CHOICES = (1, 2, 4, 8, 16, 32)
"""Decode split counts tried when the caller passed ``num_kv_splits="auto"`` and a backend's configs name none."""
PRUNE_FACTOR = 1.5
PRUNE_SLACK_US = 200.0
"""A candidate whose warm-up call (timed with a sync, so it includes launch latency: hence the slack)
takes over ``PRUNE_FACTOR * best + PRUNE_SLACK_US``, ``best`` the fastest warm-up call of the candidates
measured so far (like with like: a graph-timed median would leave out the host time a warm-up call
includes), is not measured further: a slow backend (the reference on a large shape) then costs three
calls, not a full measurement. 1.5x (3x before): on the millisecond prefill shapes of a warm-up a call's
host time is small against its GPU time, so a candidate half again slower than the best in warm-up is
not a contender; on short calls the 200 us slack, not the factor, decides."""
LONG_CALL_SAMPLES_S = 0.01
"""Fewer samples for long calls: at least 3 and enough to time ~10 ms in all, at most ``repeats`` (a
14 ms prefill needs no 7 samples of one replay each to rank candidates apart by more than its noise)."""
MAX_INPUT_SETS = 32
"""Most copies of the inputs rotated through while timing (small shapes; large ones overflow L2 alone)."""
DEFER_REFERENCE_ON = frozenset({"cuda"})
"""Device types where the reference backend (unfused PyTorch: the judge, never the fastest there) is timed only
when every other candidate failed or was rejected: its warm-up calls alone took 24 s of a 120 s TP 8 warm-up on
the H200. On the CPU it can be the fastest (Triton interpreted) and is timed like any candidate."""
CHECK_HEAD_BOUNDARIES = (16, 64)
"""Head-tile sizes of the kernels (triton's block_h 16, the WGMMA kernels' 64 heads): the check samples the heads on
both sides of the first boundary of each (15 / 16, 63 / 64) where the problem has more heads."""
CHECK_ALL_HEADS_UP_TO = 4
"""A problem with at most this many heads (or kv heads under GQA) is checked on every head."""
TIMINGS = env.TUNE_TIMINGS
"""How candidates are timed on a GPU: ``auto`` (a CUDA graph where capture works, else eager), ``graph``
(capture or fail), ``eager`` (Python calls back to back)."""
CAPTURE_HEADROOM = 0.25
"""Before a capture, a GPU with less than this fraction of its memory free gets ``torch.cuda.empty_cache()``. The
allocations of a capture come from its graph's private pool, and while a capture is under way the caching
allocator releases nothing else to make room (not the default pool's free blocks, not the pools of graphs already
dead: a dead graph's pool is returned only by ``empty_cache`` or an out-of-memory outside a capture). With nothing
released, the TP 1 warm-up (128 heads) had ~105 GiB of free blocks in graphs' pools when its captures began to fail
with out-of-memory, and its three merge shapes then failed their checks with ``CUDA error: out of memory``
(benchmarks/results/warmup_tp1_4b4b5cf_cuda05.log; the capture errors in autotune_cache/NVIDIA_H200.json)."""

log = logging.getLogger("mla_core.autotune")


class AutotuneWarning(UserWarning):
    """The tuner rejected a candidate (wrong output) or could not tune a problem; dispatch carried on."""


def mode() -> str:
    """``MLA_CORE_AUTOTUNE`` (``off`` | ``cached`` | ``on``); an unknown value is an MLAInputError naming it."""
    return env.autotune_mode()


def timing_mode() -> str:
    """``MLA_CORE_TUNE_TIMING`` (``auto`` | ``graph`` | ``eager``); an unknown value is an MLAInputError naming it."""
    return env.tune_timing()


def capturing(device_type: str) -> bool:
    """Whether the current CUDA stream is being captured into a graph (no decisions may be made then)."""
    return device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class Candidate:
    """One timed ``(backend, config)``: median microseconds per call, or the error that stopped it.

    ``timing``: how ``us`` was measured, ``"graph"`` (replays of a CUDA graph of the calls) or ``"eager"``
    (Python calls; the CPU's, a warm-up estimate's, or a GPU candidate's whose capture failed:
    ``capture_error`` says why). ``seconds``: wall seconds the tuner spent on it (first call, warm-up,
    capture, timing): where a slow warm-up goes.
    """

    backend: str
    config: dict[str, Any]
    us: float | None = None
    error: str | None = None
    note: str | None = None
    timing: str | None = None
    capture_error: str | None = None
    seconds: float | None = None

    def label(self) -> str:
        return self.backend + (" " + json.dumps(self.config, sort_keys=True) if self.config else "")

    def as_dict(self) -> dict[str, Any]:
        d = {"backend": self.backend, "config": self.config}
        if self.us is not None:
            d["us"] = round(self.us, 3)
        for name in ("timing", "capture_error", "error", "note"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        if self.seconds is not None:
            d["s"] = round(self.seconds, 3)
        return d


@dataclass
class TuneResult:
    """What :func:`tune` measured for one problem."""

    problem: Problem
    device: str
    candidates: list[Candidate]
    winner: Candidate | None
    default: Candidate | None
    rejected: list[dict[str, Any]] = field(default_factory=list)
    check: str = ""
    versions: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    first_call_s: float = 0.0
    """Of ``wall_s``, the seconds in each candidate's first, untimed call (compilation, allocation)."""
    check_s: float = 0.0
    """Of ``wall_s``, the seconds checking the fastest candidates against the reference (their runs and its)."""

    @property
    def runner_up(self) -> Candidate | None:
        """The fastest correct-or-unchecked timed candidate other than the winner (rejected ones excluded)."""
        bad = [(r["backend"], r["config"]) for r in self.rejected]
        rest = [c for c in self.candidates
                if c.us is not None and c is not self.winner and (c.backend, c.config) not in bad]
        return min(rest, key=lambda c: c.us) if rest else None

    @property
    def speedup(self) -> float | None:
        """Priority-default time over winner time (1.0 when the default won)."""
        if self.winner is None or self.default is None or self.default.us is None:
            return None
        return self.default.us / self.winner.us

    def entry(self) -> dict[str, Any]:
        """The JSON cache entry (docs/autotune.md)."""
        assert self.winner is not None
        return {"backend": self.winner.backend, "config": self.winner.config, "us": round(self.winner.us, 3),
                "timing": self.winner.timing, "versions": self.versions,
                "default": self.default.as_dict() if self.default else None,
                "speedup": round(self.speedup, 3) if self.speedup else None,
                "candidates": [c.as_dict() for c in self.candidates], "rejected": self.rejected, "check": self.check,
                "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# --------------------------------------------------------------------------------------------------
# tuning


def candidate_configs(backend: "Backend", problem: Problem) -> list[dict[str, Any]]:
    """The backend's configs; for a decode with ``num_kv_splits="auto"`` each one also carries a split count.

    Splits are only ever tuned on that explicit opt-in: otherwise the count is part of the problem.
    """
    configs = [dict(c) for c in backend.configs(problem)]
    if problem.op != "decode" or problem.get("num_kv_splits") != "auto":
        return [{k: v for k, v in c.items() if k != "num_kv_splits"} for c in configs]
    tiles = max(1, math.ceil(problem["max_len"] / 32))
    out = []
    for config in configs:
        if "num_kv_splits" in config:
            out.append(config)
        else:
            out.extend({**config, "num_kv_splits": s} for s in SPLIT_CHOICES if s <= tiles)
    return [c for i, c in enumerate(out) if c not in out[:i]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _l2_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20))
    return 0  # CPU timings serve tests; no rotation


class SlowerThanCutoff(Exception):
    """A candidate's warm-up showed it far slower than the best so far; ``us`` is its warm-up estimate."""

    def __init__(self, us: float):
        super().__init__(f"{us:.1f} us per call in warm-up")
        self.us = us


class GraphCaptureError(RuntimeError):
    """A candidate's calls could not be captured into a CUDA graph (the stream is out of capture mode again)."""


@dataclass(frozen=True)
class Measurement:
    """What :func:`measure` found: median ``us`` per call, ``timing`` (``"graph"`` | ``"eager"``), the eager
    warm-up estimate ``warmup_us`` (one call and a sync) and, when a graph was tried and failed, why."""

    us: float
    timing: str
    warmup_us: float
    capture_error: str | None = None


_side_streams: dict[int, "torch.cuda.Stream"] = {}


@contextlib.contextmanager
def _side_stream(device: torch.device) -> Iterator[None]:
    """On a GPU, run the block on one side stream per device (capture needs a non-default stream, and the
    warm-up calls must run on the stream that is captured, so lazily created per-stream state such as
    a cuBLAS workspace is not allocated inside the graph's pool); the current stream waits for it after."""
    if device.type != "cuda":
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    side = _side_streams.get(index)
    if side is None:
        side = _side_streams[index] = torch.cuda.Stream(index)
    current = torch.cuda.current_stream(index)
    side.wait_stream(current)
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        current.wait_stream(side)


def _release_pool(pool: Any, device: torch.device) -> None:
    """Give back the allocator pool of a capture whose end failed (``capture_end`` raises before it stops
    routing allocations to the pool, and the graph never owned it). Quiet where torch lacks the hooks."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    for hook in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        fn = getattr(torch._C, hook, None)
        if fn is not None:
            with contextlib.suppress(Exception):
                fn(index, pool)


def capture(step: Callable[[], Any], steps: int, device: torch.device) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of ``steps`` calls of ``step``, captured on the current stream (not the default one).

    A call that raises or an operation the stream cannot capture (a host read, a synchronization)
    gives :class:`GraphCaptureError`; the capture is ended first, so the stream is out of capture mode
    and its memory pool released (``torch.cuda.graph`` would leave both when ``capture_end`` raises).
    """
    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    stream = torch.cuda.current_stream(device)
    torch.cuda.synchronize(device)
    graph.capture_begin(pool=pool)
    try:
        for _ in range(steps):
            step()
    except BaseException as exc:
        with torch.cuda.stream(stream), warnings.catch_warnings():  # end on its own stream, whatever a failed
            warnings.filterwarnings("ignore", "The CUDA Graph is empty")  # call left current; empty is expected here
            try:
                graph.capture_end()
            except Exception:  # the capture was invalidated; the stream has left capture mode all the same
                _release_pool(pool, device)
        if isinstance(exc, Exception):
            raise GraphCaptureError(f"capture failed: {_error(exc)}") from exc
        raise
    try:
        graph.capture_end()
    except Exception as exc:
        _release_pool(pool, device)
        raise GraphCaptureError(f"capture failed: {_error(exc)}") from exc
    return graph


def _graphs(device: torch.device) -> bool:
    """Whether calls on ``device`` can be timed in a CUDA graph (a GPU; the CPU has no graphs)."""
    return device.type == "cuda"


def _graph_us(graph: "torch.cuda.CUDAGraph", steps: int, repeats: int, target_s: float) -> float:
    """Median microseconds per captured call over ``repeats`` samples, each of enough back-to-back replays
    of ``graph`` (``steps`` calls each) to last about ``target_s``."""
    graph.replay()  # the first replay uploads the graph
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    graph.replay()
    end.record()
    end.synchronize()
    replays = max(1, min(200, round(target_s * 1e3 / max(begin.elapsed_time(end), 1e-4))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for begin, end in events:
        begin.record()
        for _ in range(replays):
            graph.replay()
        end.record()
    events[-1][1].synchronize()
    return statistics.median(begin.elapsed_time(end) * 1e3 / (replays * steps) for begin, end in events)


def measure(run: Callable[[Any], Any], calls: list[Any], device: torch.device, warmup: int = 3, repeats: int = 7,
            target_s: float = 5e-4, cutoff_us: float | None = None, spent: dict[str, float] | None = None,
            timing: str = "auto") -> Measurement:
    """Median microseconds per call of ``run`` cycling through ``calls``.

    The first call (compilation, allocation) is not timed; the other ``warmup - 1`` warm-up calls
    estimate the per-call time (one call and a sync each), and with ``cutoff_us`` a candidate whose
    estimate exceeds it stops here (:class:`SlowerThanCutoff`), so a slow backend costs a few calls,
    not a full measurement. On a GPU (``timing`` ``auto`` or ``graph``) the next calls, about
    ``target_s`` of them by the estimate and at least one per input set, are captured into a CUDA graph
    whose replays are timed with CUDA events, ``repeats`` samples of ~``target_s`` each (fewer for long
    calls, :data:`LONG_CALL_SAMPLES_S`); when capture
    fails, ``graph`` raises :class:`GraphCaptureError` and ``auto`` times eager calls instead. Eager
    timing (``eager``, the fallback, the CPU): ``repeats`` samples of enough back-to-back calls to last
    about ``target_s`` (CUDA events on a GPU, perf_counter on the CPU). ``spent["first_call_s"]`` (when
    given) grows by the first call's seconds: compilation, where there is one.
    """
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
    turn = 0

    def step():
        nonlocal turn
        run(calls[turn % len(calls)])
        turn += 1

    with _side_stream(device):
        first = time.perf_counter()
        step()
        _sync(device)
        if spent is not None:
            spent["first_call_s"] = spent.get("first_call_s", 0.0) + time.perf_counter() - first
        per_call = math.inf
        for _ in range(max(1, warmup - 1)):
            start = time.perf_counter()
            step()
            _sync(device)
            per_call = min(per_call, time.perf_counter() - start)
        if cutoff_us is not None and per_call * 1e6 > cutoff_us:
            raise SlowerThanCutoff(per_call * 1e6)
        repeats = min(repeats, max(3, math.ceil(LONG_CALL_SAMPLES_S / max(per_call, 1e-7))))
        inner = max(1, min(200, round(target_s / max(per_call, 1e-7))))
        why_not_graph = None
        if _graphs(device) and timing != "eager":
            steps = max(inner, len(calls))  # every input set in the graph, so replays do not find them in L2
            if device.type == "cuda":
                _room_for_capture(device)
            try:
                graph = capture(step, steps, device)
            except GraphCaptureError as exc:
                if timing == "graph":
                    raise
                why_not_graph = str(exc)
            else:
                return Measurement(_graph_us(graph, steps, repeats, target_s), "graph", per_call * 1e6)
        if device.type == "cuda":
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(repeats)]
            for begin, end in events:
                begin.record()
                for _ in range(inner):
                    step()
                end.record()
            torch.cuda.synchronize(device)
            samples = [begin.elapsed_time(end) * 1e3 / inner for begin, end in events]
        else:
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(inner):
                    step()
                samples.append((time.perf_counter() - t0) * 1e6 / inner)
    return Measurement(statistics.median(samples), "eager", per_call * 1e6, why_not_graph)


def _room_for_capture(device: torch.device) -> None:
    """Empty the caching allocator when less than :data:`CAPTURE_HEADROOM` of ``device``'s memory is free: a capture
    cannot reclaim what the cache holds outside its own pool."""
    free, total = torch.cuda.mem_get_info(device)
    if free < CAPTURE_HEADROOM * total:
        torch.cuda.empty_cache()


def release_memory(device_type: str, collect: bool = False) -> None:
    """Return to the device what a tuned problem left cached (nothing to do on the CPU): on a GPU
    ``torch.cuda.empty_cache()``, which frees the default pool's free blocks and the private pools of the CUDA graphs
    it timed (dead, yet reserved until then: :data:`CAPTURE_HEADROOM`). ``collect``: run the garbage collector first
    (~0.1 s, so only after a problem whose tune raised: its traceback can sit in a reference cycle holding tensors,
    and the collector counts objects, never device bytes)."""
    if collect:
        gc.collect()
    if device_type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _outputs(result) -> tuple[torch.Tensor, ...]:
    """Clones of the tensors an op returned (None entries dropped), safe from later runs reusing buffers."""
    tensors = (result,) if isinstance(result, torch.Tensor) else tuple(t for t in result if t is not None)
    return tuple(t.detach().clone() for t in tensors)


def _checked_run(backend: "Backend", problem: Problem, call: Any, config: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    for buf in inputs.output_buffers(call):  # a kernel that skips part of its output must not pass on stale data
        buf.fill_(float("nan"))
    return _outputs(backend.run(problem, call, config))


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def check_heads(n: int, key: str) -> list[int] | None:
    """The heads (kv heads under GQA) of ``n`` the reference check judges, sorted; None: all of them.

    The first, middle and last, both sides of each :data:`CHECK_HEAD_BOUNDARIES` boundary below ``n``, and one
    more chosen by a hash of ``key`` (the problem key without ``lse``), so shapes of one warm-up judge
    different interior heads. 16 heads: 4 of them; 128: 7. At most :data:`CHECK_ALL_HEADS_UP_TO` heads: all.
    """
    if n <= CHECK_ALL_HEADS_UP_TO:
        return None
    picked = {0, n // 2, n - 1}
    for tile in CHECK_HEAD_BOUNDARIES:
        if tile < n:
            picked |= {tile - 1, tile}
    extra = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % n
    while extra in picked and len(picked) < n:
        extra = (extra + 1) % n
    picked.add(extra)
    return None if len(picked) >= n else sorted(picked)


_HEAD_AXES = {"decode": (1, 1), "prefill": (1, 0), "merge": (1, 0)}
"""Per op whose heads are independent, the head axis of each result tensor: decode out [batch, heads, 512] and
lse [batch, heads]; prefill out [total_q, heads, v_dim] and lse [heads, total_q]; merge output [tokens, heads, dim]
and output_lse [heads, tokens]."""


@dataclass(frozen=True)
class HeadSample:
    """The reference check on a sample of heads: ``problem`` / ``call`` hold only the heads ``heads`` (of ``of``),
    which the full call's results are cut to (:meth:`take`) before they are compared."""

    problem: Problem
    call: Any
    heads: tuple[int, ...]
    of: int

    def take(self, result: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """``result`` of the full call (an op's tensors, None entries dropped) cut to the sampled heads."""
        index = torch.tensor(self.heads, dtype=torch.long, device=result[0].device if result else "cpu")
        return tuple(t.index_select(axis, index) for t, axis in zip(result, _HEAD_AXES[self.problem.op]))

    def describe(self) -> str:
        return f"heads {','.join(map(str, self.heads))} of {self.of}"


def head_sample(problem: Problem, call: Any) -> HeadSample | None:
    """The call cut to the heads :func:`check_heads` picks, for ops whose heads are computed independently
    (decode, prefill, merge: per-tensor scales are the call's, never measured from the data); None: check all.

    Prefill under GQA samples whole kv-head groups (every query head of a sampled kv head). A decode whose
    split count is the reference's heuristic (``num_kv_splits=None``) is given that count explicitly,
    computed on the full call: the heuristic reads the head count.
    """
    op = problem.op
    if op not in _HEAD_AXES:
        return None
    key = _key_without_lse(problem)
    sizes: dict[str, int] = {}
    if op == "prefill":
        heads, kv_heads = call.q.shape[1], call.k.shape[1]
        group = heads // kv_heads
        kv_pick = check_heads(kv_heads, key)
        if kv_pick is None:
            return None
        pick = [h * group + j for h in kv_pick for j in range(group)]
        kv = torch.tensor(kv_pick, dtype=torch.long, device=call.k.device)
        q = torch.tensor(pick, dtype=torch.long, device=call.q.device)
        sub = dataclasses.replace(call, q=call.q.index_select(1, q), k=call.k.index_select(1, kv),
                                  v=call.v.index_select(1, kv))
        sizes = {"heads": len(pick), "kv_heads": len(kv_pick)}
    elif op == "decode":
        heads = call.q.shape[1]
        pick = check_heads(heads, key)
        if pick is None:
            return None
        q = torch.tensor(pick, dtype=torch.long, device=call.q.device)
        sub = dataclasses.replace(call, q=call.q.index_select(1, q), num_kv_splits=specs.decode_num_splits(call, {}))
        sizes = {"heads": len(pick)}
    else:
        tokens, heads, dim = call.prefix_output.shape
        pick = check_heads(heads, key)
        if pick is None:
            return None
        i = torch.tensor(pick, dtype=torch.long, device=call.prefix_output.device)
        sub = dataclasses.replace(
            call, prefix_output=call.prefix_output.index_select(1, i), prefix_lse=call.prefix_lse.index_select(0, i),
            suffix_output=call.suffix_output.index_select(1, i), suffix_lse=call.suffix_lse.index_select(0, i),
            output=None if call.output is None else call.output.new_empty((tokens, len(pick), dim)),
            output_lse=None if call.output_lse is None else call.output_lse.new_empty((len(pick), tokens)))
        sizes = {"heads": len(pick)}
    sub_problem = Problem.make(op, problem.device, problem.features, **{**dict(problem.params), **sizes})
    return HeadSample(sub_problem, sub, tuple(pick), heads)


SHARE_REFERENCE_OPS = frozenset({"prefill"})
"""Ops whose reference result one check keeps for the next problem differing only in ``return_lse``: warm-up tunes
each prefill shape without and then with LSE on the same inputs (decode keys there all return LSE)."""


@dataclass
class _SharedReference:
    """The last reference result of a :data:`SHARE_REFERENCE_OPS` check: ``call`` run with LSE, ``result``
    (out, lse); ``owner``: the key (without LSE) of the tuned problem whose check computed it."""

    key: str
    call: Any
    result: tuple[torch.Tensor, ...]
    owner: str


_shared_reference: _SharedReference | None = None


def release_shared_reference() -> None:
    """Drop the kept reference result (and the inputs it was computed on): :func:`mla_core.autotune.warmup.run`
    calls it when done, so a warm-up leaves no tensors behind."""
    global _shared_reference
    _shared_reference = None


def _key_without_lse(problem: Problem) -> str:
    return Problem(problem.op, problem.device, problem.params, problem.features - {"lse"}).key()


def _keep_shared_reference_only_for(problem: Problem) -> None:
    """Drop the kept reference result unless ``problem`` is the one it was computed for or its LSE twin (the next
    key of a warm-up): no tensor of one problem lives on into the timing of another."""
    global _shared_reference
    if _shared_reference is not None and _shared_reference.owner != _key_without_lse(problem):
        _shared_reference = None


def _same_inputs(a: Any, b: Any) -> bool:
    """Whether two call objects hold equal arguments: tensors of one shape, dtype and device with equal values,
    every other field equal."""
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                    and x.dtype == y.dtype and x.device == y.device and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def _reference_result(backend: "Backend", problem: Problem, call: Any, owner: Problem) -> tuple[torch.Tensor, ...]:
    """The reference's result on ``call`` (of ``problem``: ``owner``, the tuned problem, or its head sample). For
    :data:`SHARE_REFERENCE_OPS` it runs with LSE and is kept, and a call with equal inputs (:func:`_same_inputs`,
    ``return_lse`` aside) of the same key without LSE reuses it: the reference's output does not depend on whether
    LSE is returned. The next tune of another problem drops it (:func:`_keep_shared_reference_only_for`)."""
    global _shared_reference
    if problem.op not in SHARE_REFERENCE_OPS:
        return _checked_run(backend, problem, call, {})
    key = f"{backend.name} {backend.version} " + _key_without_lse(problem)
    with_lse = dataclasses.replace(call, return_lse=True)
    shared = _shared_reference
    if shared is None or shared.key != key or not _same_inputs(shared.call, with_lse):
        _shared_reference = None  # the old one's tensors are freed before the new run
        problem_lse = Problem(problem.op, problem.device, problem.params, problem.features | {"lse"})
        shared = _shared_reference = _SharedReference(key, with_lse, _checked_run(backend, problem_lse, with_lse, {}),
                                                      _key_without_lse(owner))
    return shared.result if call.return_lse else shared.result[:1]


def _has_nan(result: tuple[torch.Tensor, ...]) -> bool:
    """Whether any float tensor of a result holds a NaN (poison left unwritten, or computed)."""
    return any(bool(torch.isnan(t).any()) for t in result if t.is_floating_point() and t.element_size() > 1)


def _explicit_splits(call: Any, config: dict[str, Any]) -> Any:
    """The call with the split count a config chose for ``num_kv_splits="auto"`` written in (else ``call``).

    With P quantized the split count changes results, so the reference must be judged on the same
    count; a call that names it needs no config (the reference's own heuristic would differ).
    """
    if getattr(call, "num_kv_splits", 0) is None and "num_kv_splits" in config:
        return dataclasses.replace(call, num_kv_splits=int(config["num_kv_splits"]))
    return call


def tune(problem: Problem, valid: "list[Backend] | None" = None, *, device: torch.device | str | None = None,
         reference: str | None = None, warmup: int = 3, repeats: int = 7, seed: int = 0,
         timing: str | None = None, check_sampled: bool = True) -> TuneResult:
    """Time every valid ``(backend, config)`` of ``problem`` and pick the fastest whose output matches the reference.

    ``reference``: the backend that judges correctness (default :data:`REFERENCE`, ``"reference"``).
    ``valid``: the candidate backends, highest priority first (default: every backend that can run
    ``problem``); the first one's first config is the priority default the speed-up is measured
    against. ``device``: where to run (default: the problem's device type, the current CUDA device).
    ``timing``: ``auto`` | ``graph`` | ``eager`` (default ``MLA_CORE_TUNE_TIMING``, else ``auto``; see
    :func:`measure`). ``check_sampled``: the reference judges the fastest candidate on a sample of heads
    (:func:`head_sample`; the candidate still runs the whole problem, and a NaN anywhere in its output
    rejects it); False: on every head. Nothing is written to the cache (see :func:`record`). Raises
    RuntimeError during CUDA graph capture. Returns what it cached on the device when done, also when it raises
    (:func:`release_memory`); a reference result kept for another problem is dropped first.
    """
    if capturing(problem.device):
        raise RuntimeError("mla_core never tunes during CUDA graph capture; warm the cache up before capturing")
    _keep_shared_reference_only_for(problem)
    try:
        return _tune(problem, valid, device, reference, warmup, repeats, seed, timing, check_sampled)
    finally:
        release_memory(torch.device(device if device is not None else problem.device).type)


def _tune(problem: Problem, valid: "list[Backend] | None", device: torch.device | str | None, reference: str | None,
          warmup: int, repeats: int, seed: int, timing: str | None, check_sampled: bool) -> TuneResult:
    """:func:`tune`'s work: its inputs, the candidates' outputs and the reference's die when it returns."""
    from ..dispatch import candidates as valid_backends
    from ..plugins import backends
    started = time.perf_counter()
    reference = reference or REFERENCE
    timing = timing or timing_mode()
    if timing not in TIMINGS:
        raise MLAInputError(f"timing={timing!r} is not one of {', '.join(TIMINGS)}")
    if valid is None:
        valid = valid_backends(problem)[0]
    device = torch.device(device if device is not None else problem.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dev_name = cache.device_name(device.type, device.index)
    first = inputs.make_call(problem, device, seed)
    sets = max(1, min(MAX_INPUT_SETS, math.ceil(2 * _l2_bytes(device) / max(1, inputs.call_nbytes(first)))))
    calls = [first] + [inputs.make_call(problem, device, seed + i) for i in range(1, sets)]

    timed: list[Candidate] = []
    spent: dict[str, float] = {}
    best_warmup = math.inf  # pruning compares warm-up estimates (eager calls), whatever the timing kind

    def time_backend(backend: "Backend") -> list[Candidate]:
        """Each config of ``backend`` measured (or pruned, or failed), in order."""
        nonlocal best_warmup
        try:
            configs = candidate_configs(backend, problem)
        except Exception as exc:  # a broken backend is reported in the entry, not fatal
            return [Candidate(backend.name, {}, error=f"configs() failed: {_error(exc)}")]
        out = []
        for config in configs:
            cand = Candidate(backend.name, config)
            begun = time.perf_counter()
            try:
                m = measure(lambda c, b=backend, cfg=config: b.run(problem, c, cfg), calls, device, warmup, repeats,
                            cutoff_us=PRUNE_FACTOR * best_warmup + PRUNE_SLACK_US if best_warmup < math.inf else None,
                            spent=spent, timing=timing)
                cand.us, cand.timing, cand.capture_error = m.us, m.timing, m.capture_error
                best_warmup = min(best_warmup, m.warmup_us)
            except SlowerThanCutoff as slow:
                cand.us, cand.timing = slow.us, "eager"
                cand.note = f"warm-up estimate only (over {PRUNE_FACTOR:g}x the best so far)"
            except Exception as exc:
                cand.error = _error(exc)
            cand.seconds = time.perf_counter() - begun
            out.append(cand)
        return out

    deferred = [b for b in valid if device.type in DEFER_REFERENCE_ON and b.name == reference and len(valid) > 1]
    for backend in valid:
        if backend not in deferred:
            timed.extend(time_backend(backend))
    default = timed[0] if timed else None

    by_name = {b.name: b for b in valid}
    check_started = time.perf_counter()
    ref_backend = backends().get(reference)
    ref_out: tuple[torch.Tensor, ...] | None = None
    sample: HeadSample | None = None
    winner, rejected, check = None, [], ""
    for cand in sorted((c for c in timed if c.us is not None), key=lambda c: c.us):
        if cand.backend == reference:
            winner, check = cand, "is the reference"
            break
        if ref_backend is None or ref_backend.why_not(problem):
            winner, check = cand, f"unchecked: the {reference!r} backend cannot run this problem"
            break
        try:
            out = _checked_run(by_name[cand.backend], problem, first, cand.config)
            ref_call = _explicit_splits(first, cand.config)
            if ref_out is None or ref_call is not first:
                sample = head_sample(problem, ref_call) if check_sampled else None
                ref_out = (_reference_result(ref_backend, sample.problem, sample.call, problem) if sample
                           else _reference_result(ref_backend, problem, ref_call, problem))
            nan = sample is not None and _has_nan(out)  # unsampled heads: at least no poison left, no NaN made
            err = math.inf if nan else compare(sample.take(out) if sample else out, ref_out)
            tol = tolerance(ref_out[0].dtype) if ref_out else 0.0
        except Exception as exc:
            rejected.append({**cand.as_dict(), "reason": f"check run failed: {_error(exc)}"})
            continue
        judged = f" on {sample.describe()}" if sample else ""
        if err < tol:
            winner, check = cand, f"rel L2 {err:.2e} against {reference}{judged} (tolerance {tol:g})"
            break
        reason = (f"NaN in its output (the reference judged {sample.describe()})" if nan else
                  f"output differs from {reference}{judged}: rel L2 {err:.3g} >= tolerance {tol:g}")
        rejected.append({**cand.as_dict(), "reason": reason})
        warnings.warn(f"mla_core autotune rejected {cand.label()} for {problem.key()}: {reason}", AutotuneWarning,
                      stacklevel=2)
    if winner is None and deferred:
        refs = [c for c in time_backend(deferred[0]) if c.us is not None]
        timed.extend(refs)
        if refs:
            winner, check = refs[0], "is the reference (every other candidate failed or was rejected)"

    check_s = time.perf_counter() - check_started
    versions = cache.versions(by_name[winner.backend], dev_name) if winner else {}
    result = TuneResult(problem, dev_name, timed, winner, default, rejected, check, versions,
                        time.perf_counter() - started, spent.get("first_call_s", 0.0), check_s)
    log.info("tuned %s: %s", problem.key(), winner.label() if winner else "no candidate")
    return result


def record(result: TuneResult) -> bool:
    """Write a tune result's winner into the user cache (True when it reached the disk)."""
    if result.winner is None:
        return False
    return cache.store(result.device, {result.problem.key(): result.entry()})


# --------------------------------------------------------------------------------------------------
# dispatch's entry point


def _choice(backend: "Backend", config: dict[str, Any], source: str) -> Choice:
    return Choice(backend, dict(config), source)


def _cached_choice(read: Callable[[str], dict[str, dict]], where: Callable[[str], Any], source: str):
    """A dispatch choice source reading one cache (user or shipped): a current entry among the valid backends
    whose config that backend accepts (:meth:`~mla_core.backend.Backend.validate_config`). An entry with
    a config its backend refuses is never run: one CacheWarning names the file and the key."""

    def lookup(problem: Problem, valid: "list[Backend]") -> Choice | None:
        if mode() == "off":
            return None
        dev_name = cache.device_name(problem.device)
        key = problem.key()
        entry = read(dev_name).get(key)
        backend = {b.name: b for b in valid}.get(entry["backend"]) if entry else None
        if backend is None or not cache.is_current(entry, backend, dev_name):
            return None
        why = plugins.validate_config(backend, problem, entry["config"])
        if why:
            cache._warn_once(f"invalid:{source}:{dev_name}:{key}",
                             f"mla_core autotune cache {where(dev_name)}: entry {key!r} is ignored: its "
                             f"{backend.name} config {json.dumps(entry['config'], sort_keys=True)[:200]} is not "
                             f"valid ({'; '.join(why)})")
            return None
        return _choice(backend, entry["config"], source)

    lookup.__name__ = f"{source}_choice"
    return lookup


user_cache_choice = _cached_choice(cache.user_entries, cache.user_file, "cache")
shipped_choice = _cached_choice(cache.shipped_entries, cache.shipped_file, "shipped")


def tuned_choice(problem: Problem, valid: "list[Backend]") -> Choice | None:
    """Tune ``problem`` now (only with ``MLA_CORE_AUTOTUNE=on``, never during graph capture) and record the winner."""
    if mode() != "on" or capturing(problem.device):
        return None
    key = problem.key()
    try:
        result = tune(problem, valid)
    except inputs.ProblemInputsError as exc:
        warnings.warn(f"mla_core autotune cannot tune {key}: {exc}; using the priority rule", AutotuneWarning,
                      stacklevel=3)
        return None
    if result.winner is None:
        warnings.warn(f"mla_core autotune found no working candidate for {key}; using the priority rule",
                      AutotuneWarning, stacklevel=3)
        return None
    record(result)
    return _choice({b.name: b for b in valid}[result.winner.backend], result.winner.config, "tuned")


CHOICE_SOURCES = (user_cache_choice, shipped_choice, tuned_choice)
"""What dispatch asks on an in-memory miss, in order (:func:`mla_core.dispatch.add_choice_source`)."""


# --------------------------------------------------------------------------------------------------
# many processes


def _local_choices() -> dict[str, dict[str, Any]]:
    """Every choice this process would use: current user-cache entries and the in-memory dispatch choices."""
    from ..dispatch import _memory
    from ..plugins import backends
    loaded = backends()
    out: dict[str, dict[str, Any]] = {}
    for (override, problem), choice in list(_memory.items()):
        if override is None and choice.source != "override":
            out[problem.key()] = {"backend": choice.backend.name, "config": choice.config, "source": choice.source}
    for dev_type in {"cuda", "cpu"} | {Problem.from_key(k).device for k in out}:
        dev_name = cache.device_name(dev_type)
        for key, entry in cache.user_entries(dev_name).items():  # malformed keys were skipped on read
            backend = loaded.get(entry["backend"])
            if key.split("|", 2)[1] == dev_type and backend is not None and cache.is_current(entry, backend, dev_name):
                out.setdefault(key, entry)
    return out


def install(entries: dict[str, dict[str, Any]], source: str = "synced") -> int:
    """Make ``entries`` (key -> entry) this process's choices: dispatch memory, and the user cache for full entries.

    An entry with a malformed key or schema, whose backend is not loaded here or cannot run the
    problem, or whose config that backend refuses is skipped with a warning. Returns the number installed.
    """
    from ..dispatch import _memory
    from ..plugins import backends
    loaded = backends()
    to_store: dict[str, dict[str, dict]] = {}
    count = 0
    if not isinstance(entries, dict):
        warnings.warn(f"mla_core autotune: received {type(entries).__name__}, not an object of entries; ignored",
                      AutotuneWarning, stacklevel=2)
        return 0
    for key, entry in entries.items():
        bad = cache.key_problem(key) or (
            None if isinstance(entry, dict) and isinstance(entry.get("backend"), str)
            and isinstance(entry.get("config", {}), dict) else "not an object with a backend and a config")
        if bad:
            warnings.warn(f"mla_core autotune: entry {str(key)[:200]!r} ignored: {bad}", AutotuneWarning, stacklevel=2)
            continue
        problem = Problem.from_key(key)
        backend = loaded.get(entry["backend"])
        config = entry.get("config") or {}
        why = (plugins.why_not(backend, problem) or plugins.validate_config(backend, problem, config)
               if backend is not None else ["not loaded here"])
        if why:
            warnings.warn(f"mla_core autotune: cannot use {entry['backend']!r} {json.dumps(config)[:200]} for {key} "
                          f"here ({'; '.join(why)})", AutotuneWarning, stacklevel=2)
            continue
        _memory[(None, problem)] = _choice(backend, config, source)
        count += 1
        if "versions" in entry:
            to_store.setdefault(cache.device_name(problem.device), {})[key] = entry
    for dev_name, new in to_store.items():
        cache.store(dev_name, new)
    return count


def sync(group=None) -> int:
    """Make every rank of ``group`` (default: the world) use rank 0's choices; returns how many were received.

    Rank 0 sends every choice it would use (current user-cache entries and its in-memory decisions);
    the other ranks install them in memory and merge them into their user cache. A no-op (returns 0)
    when torch.distributed is not initialized. Every rank of the group must call it.
    """
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    rank = dist.get_rank(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    # JSON bytes travel in a uint8 tensor (its length first), so a receiver parses data and never
    # unpickles a structure another process built (broadcast_object_list would).
    payload = json.dumps(_local_choices()).encode() if rank == 0 else b""
    entries = json.loads(_broadcast_bytes(payload, src, group).decode())
    if rank == 0:
        return len(entries)
    return install(entries)


def all_gather_json(value: Any, group=None) -> list[Any]:
    """Every rank's JSON-serializable ``value``, in rank order, travelling as JSON bytes in uint8 tensors
    (lengths first, then the bytes padded to the longest), never pickled (``all_gather_object`` unpickles)."""
    import torch.distributed as dist
    device = _collective_device(group)
    data = json.dumps(value).encode()
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device), group=group)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    bufs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(bufs, mine, group=group)
    return [json.loads(b[:int(n.item())].cpu().numpy().tobytes().decode()) for b, n in zip(bufs, sizes)]


def _collective_device(group=None) -> torch.device:
    """Where collective tensors live: the current CUDA device under NCCL, else the CPU."""
    import torch.distributed as dist
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_bytes(data: bytes, src: int, group=None) -> bytes:
    """``data`` of rank ``src`` on every rank of ``group``: a length tensor, then a uint8 tensor, on the
    backend's device (the current CUDA device under NCCL, else the CPU)."""
    import torch.distributed as dist
    device = _collective_device(group)
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    if dist.get_rank() == src:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(buf, src=src, group=group)
    return buf.cpu().numpy().tobytes()
