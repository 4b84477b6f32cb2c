"""Host (Python) time of one eager decode step of ``mla_core.mla_forward`` and of ``MLAAttention`` (issue 11).

Times, per call, the median and the minimum of ``--repeats`` loops of back-to-back calls (perf_counter, or the
thread's CPU time with ``--clock thread``; on a GPU one synchronize per loop, so a host-bound step measures its
host time):

* the layer's inner decode alone (dispatch and ``Backend.run``, as the triton layer calls it: "decode op");
* ``mla_core.mla_forward`` (the layer op, one new token per request) with ``MLA_CORE_CHECKS=full`` and
  ``metadata``;
* ``MLAAttention.forward`` (projections, RMSNorm, the layer op, o_proj) in both modes;

and with ``--profile N`` prints a cProfile top-N by cumulative time of each, with ``--count`` the Python calls,
aten ops and stubbed launches of one call. On the CPU, ``--backend triton --stub-triton`` (under
``TRITON_INTERPRET=1``) runs the GPU's code path with every Triton launch replaced by a no-op: everything the
host does around the kernels, nothing of the interpreter; ``--stub-cuda --dims latent`` adds the cuda backend's
decode launcher (its extension calls are no-ops: the pybind11 call is not seen; ``--backend cuda``: the module's
attention on cuda, its layer op automatic). The same script runs against an older checkout with ``PYTHONPATH``
pointing at its sources (the folders benchmarks/device_run.sh's fallback lists), which is how the eager-step
regression of issue 11 was looked for (NOTES "Eager host overhead").

    python benchmarks/host_overhead.py [--backend reference] [--heads 2] [--batch 1] [--profile 20] [--count] [--json out.json]
    TRITON_INTERPRET=1 python benchmarks/host_overhead.py --backend triton --stub-triton   # the GPU's path, no kernels
    TRITON_INTERPRET=1 python benchmarks/host_overhead.py --backend cuda --stub-triton --stub-cuda --dims latent
    python benchmarks/host_overhead.py --device cuda --dims deepseek --heads 16 --length 8192 --backend ''  # H200
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from types import SimpleNamespace

import torch

import mla_core

DIMS = {  # hidden, q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head_dim, page size
    "tiny": (64, 32, 32, 16, 8, 16, 4),
    "latent": (64, 32, 512, 16, 64, 16, 64),     # DeepSeek's cache row (what the cuda decode takes), tiny GEMMs
    "deepseek": (7168, 1536, 512, 128, 64, 128, 64),
}


def per_call_us(fn, device: torch.device, loop_s: float = 0.1, repeats: int = 15,
                clock=time.perf_counter) -> tuple[float, float]:
    """Median and minimum over ``repeats`` loops (each about ``loop_s`` long) of the time per call, in µs (the
    minimum is the least disturbed loop on a shared CPU)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(5):
        fn()
    sync()
    start = clock()
    for _ in range(10):
        fn()
    sync()
    calls = max(5, int(loop_s / ((clock() - start) / 10)))
    samples = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        sync()
        samples.append((clock() - start) * 1e6 / calls)
    return statistics.median(samples), min(samples)


def config(heads: int, dims: str) -> SimpleNamespace:
    """A DeepSeek-V3-shaped attention config (bf16 weights, no FP8 blocks) at ``dims`` sizes."""
    hidden, q_lora, latent, nope, rope, v_dim, _ = DIMS[dims]
    return SimpleNamespace(hidden_size=hidden, num_attention_heads=heads, q_lora_rank=q_lora, kv_lora_rank=latent,
                           qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v_dim,
                           max_position_embeddings=1 << 16, rope_theta=10000.0, rope_scaling=None,
                           attention_bias=False, rope_interleave=True, rms_norm_eps=1e-6)


def module_step(heads: int, batch: int, length: int, backend: str | None, device: torch.device, dims: str = "tiny",
                dtype: torch.dtype = torch.bfloat16):
    """(module, step): a decode step of MLAAttention, ``batch`` requests with ``length - 1`` cached tokens each."""
    from mla_core.nn import MLAAttention, StaticPageTable
    torch.manual_seed(0)
    page = DIMS[dims][-1]
    table = StaticPageTable(batch, length, page, device=device, generator=torch.Generator().manual_seed(0))
    mod = MLAAttention(config(heads, dims), num_pages=table.num_pages, page_size=page, dtype=dtype,
                       device=device, attention_backend=backend)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.02)
    mod.latent_cache.normal_()
    table.lengths.fill_(length - 1)
    hidden = torch.randn(batch, mod.hidden_size, device=device).to(dtype)
    offsets = torch.arange(batch + 1, dtype=torch.int32, device=device)

    def step():
        with torch.no_grad():
            return mod(hidden, offsets, table.block_table, table.lengths, max_seq_len=1)
    return mod, step


def layer_step(mod, batch: int, length: int, backend: str | None):
    """The layer op alone on the module's cache and weights (q and kv as the projections would give them)."""
    device = mod.latent_cache.device
    dtype = mod.latent_cache.dtype
    q = torch.randn(batch, mod.local_heads, mod.qk_dim, device=device).to(dtype)
    kv = torch.randn(batch, mod.kv_lora_rank + mod.rope_dim, device=device).to(dtype)
    pages = -(-length // mod.latent_cache.shape[1])
    table = torch.arange(batch * pages, dtype=torch.int32, device=device).view(batch, pages)
    offsets = torch.arange(batch + 1, dtype=torch.int32, device=device)
    lengths = torch.full((batch,), length - 1, dtype=torch.int64, device=device)
    weights = mod.layer_weights()
    layer_backend = backend if backend is None or "layer" in mla_core.get_backend(backend).capabilities else None

    def step():
        with torch.no_grad():
            return mla_core.mla_forward(q, kv, offsets, mod.freqs_cis, mod.kv_a_layernorm.weight, mod.latent_cache,
                                        table, lengths, max_seq_len=1, softmax_scale=mod.softmax_scale,
                                        attention_backend=backend, backend=layer_backend, **weights)
    return step


def decode_step(mod, batch: int, length: int, backend: str | None):
    """The layer's inner decode alone as the triton layer runs it: dispatch and ``Backend.run`` of a validated
    call (absorbed q [batch, heads, latent + rope], the module's cache, int32 key counts, num_kv_splits "auto")."""
    from mla_core import dispatch, specs
    device, cache = mod.latent_cache.device, mod.latent_cache
    q = torch.randn(batch, mod.local_heads, mod.kv_lora_rank + mod.rope_dim, device=device).to(cache.dtype)
    pages = -(-length // cache.shape[1])
    table = torch.arange(batch * pages, dtype=torch.int32, device=device).view(batch, pages)
    lengths = torch.full((batch,), length, dtype=torch.int32, device=device)
    with specs.values_checked():
        problem, call = specs.validate_decode(
            q, cache, table, lengths, softmax_scale=mod.softmax_scale, kv_lora_rank=mod.kv_lora_rank,
            qk_rope_head_dim=mod.rope_dim, page_size=None, num_kv_splits="auto", k_qdq=None, k_qdq_amax=None,
            v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)

    def step():
        choice = dispatch.choose(problem, backend)
        return choice.backend.run(problem, call, choice.config)
    return step


_LAUNCHES = [0]
"""Triton launches and cuda extension calls seen by the stubs (``--stub-triton``, ``--stub-cuda``)."""


class _CudaStub:
    """The cuda extension's decode entries as no-ops (outputs stay as allocated), each call counted."""

    @staticmethod
    def decode_wgmma(*args):
        _LAUNCHES[0] += 1

    @staticmethod
    def decode(*args):
        _LAUNCHES[0] += 1


def stub_cuda() -> None:
    """Make the cuda backend run CPU tensors with :class:`_CudaStub` as its extension: its Python launcher and
    dispatch as on the GPU, no kernel (the pybind11 call's own cost is not seen)."""
    from mla_core import dispatch
    from mla_core_cuda import backend, build
    backend.device_reason = lambda: None
    build._LOADED[build.build_key()] = _CudaStub      # what a loaded build answers (the key hashes csrc/)
    backend.CudaBackend.device_types = frozenset({"cuda", "cpu"})
    dispatch.clear_memory()


_VIEW_OPS = {"view", "t", "transpose", "slice", "select", "unsqueeze", "squeeze", "reshape", "expand", "as_strided",
             "detach", "alias", "permute", "_unsafe_view", "split", "split_with_sizes", "narrow", "unbind"}


def count(fn) -> dict:
    """One call of ``fn``: Python function calls (profile 'call' events), aten ops (``ops``; ``device_ops`` without
    views and ``empty``: what launches a kernel or copies on a GPU) and stubbed launches (Triton kernels, cuda
    extension calls)."""
    import sys
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    calls = [0]

    def tracer(frame, event, arg):
        if event == "call":
            calls[0] += 1
    sys.setprofile(tracer)
    try:
        fn()
    finally:
        sys.setprofile(None)
    ops = Ops()
    _LAUNCHES[0] = 0
    with ops:
        fn()
    device_ops = [n for n in ops.names if n not in _VIEW_OPS and n != "empty"]
    return dict(python_calls=calls[0], ops=len(ops.names), device_ops=len(device_ops), device_op_names=device_ops,
                triton_launches=_LAUNCHES[0])


def _frame(x):
    return x


def launch_costs(device: torch.device, repeats: int) -> list[dict]:
    """Host µs per call of the step's building blocks alone (median of ``repeats`` loops): a Python call, a dict
    hit, ``torch.empty``, a view, a small ``linear`` (GPU work far below its launch), an RMSNorm, a small ``bmm``,
    and on a GPU a Triton launch of 2 tensors + 4 ints (the calibration of the host model in benchmarks/NOTES.md)."""
    bf16 = torch.bfloat16
    x = torch.randn(1, 1024, device=device, dtype=bf16)
    w = torch.randn(256, 1024, device=device, dtype=bf16)
    r = torch.randn(1, 1536, device=device, dtype=bf16)
    qb = torch.randn(16, 1, 128, device=device, dtype=bf16)
    wb = torch.randn(16, 128, 512, device=device, dtype=bf16)
    memo = {("key", 1): 2}
    blocks = [("python call", lambda: _frame(x)), ("dict hit", lambda: memo.get(("key", 1))),
              ("torch.empty", lambda: torch.empty(1, 16, 576, device=device, dtype=bf16)),
              ("view", lambda: x.view(1024, 1)),
              ("linear [1, 1024] -> 256", lambda: torch.nn.functional.linear(x, w)),
              ("rms_norm 1536", lambda: torch.nn.functional.rms_norm(r, (1536,), eps=1e-6)),
              ("bmm 16 x [1,128] x [128,512]", lambda: torch.bmm(qb, wb))]
    if device.type == "cuda":
        import triton
        import triton.language as tl

        @triton.jit
        def _copy(src, dst, n, a, b, c, BLOCK: tl.constexpr):
            i = tl.arange(0, BLOCK)
            tl.store(dst + i, tl.load(src + i, mask=i < n) + a + b + c, mask=i < n)
        src, dst = torch.zeros(64, device=device), torch.empty(64, device=device)
        blocks.append(("Triton launch (2 tensors, 4 scalars)", lambda: _copy[(1,)](src, dst, 64, 1, 2, 3, BLOCK=64)))
    rows = []
    for name, fn in blocks:
        median, least = per_call_us(fn, device, loop_s=0.02, repeats=repeats)
        rows.append(dict(what=name, us=median, min_us=least))
        print(f"{name:>38}  median {median:7.2f} µs/call  (min {least:7.2f})", flush=True)
    return rows


def profile(fn, top: int, calls: int = 200, sort: str = "cumulative") -> str:
    """cProfile of ``calls`` calls of ``fn``: the top ``top`` functions by ``sort`` (cumulative or tottime)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(top)
    return out.getvalue()


def torch_profile(fn, top: int, device: torch.device, calls: int = 50) -> str:
    """torch.profiler of ``calls`` calls of ``fn`` (CPU, and CUDA on a GPU): the top ``top`` aten ops and runtime
    calls by self host time (totals over the calls; a synchronizing call shows as a long cudaStreamSynchronize or
    cudaMemcpyAsync)."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn()
    with tprofile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dims", choices=sorted(DIMS), default="tiny")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                    help="weights, cache and activations (CPU: float32 GEMMs cost about their dispatch, bf16 ones "
                         "with more than 64 outputs ~15 µs of oneDNN work each, which a GPU's host does not do)")
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--backend", default="reference", help="backend of the layer and its attention ('' = automatic)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="thread: this thread's CPU time (a CPU stub on a shared machine; on a GPU it misses the "
                         "waits of a synchronizing step)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: tiny ops, a shared CPU)")
    ap.add_argument("--stub-triton", action="store_true",
                    help="(TRITON_INTERPRET=1) Triton kernel launches do nothing: time the host path around them")
    ap.add_argument("--stub-cuda", action="store_true",
                    help="the cuda backend runs CPU tensors, its extension calls do nothing (with --dims latent)")
    ap.add_argument("--profile", type=int, default=0, help="print a cProfile top-N by cumulative time")
    ap.add_argument("--profile-sort", default="cumulative", choices=("cumulative", "tottime"),
                    help="the order of --profile's table")
    ap.add_argument("--torch-profile", type=int, default=0,
                    help="print torch.profiler's top-N aten ops and runtime calls by self host time")
    ap.add_argument("--only", help="comma-separated rows to time (e.g. 'MLAAttention'; default all three)")
    ap.add_argument("--count", action="store_true", help="count Python calls, aten ops and stubbed launches "
                                                           "of one call (after the timed loops)")
    ap.add_argument("--launch-costs", action="store_true", help="first time the step's building blocks alone")
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.stub_triton:
        from triton.runtime import interpreter
        interpreter.GridExecutor.__init__ = lambda self, *a, **k: None      # no interpreter argument handling
        def launch(self, *a, **k):      # outputs stay as allocated
            _LAUNCHES[0] += 1
        interpreter.GridExecutor.__call__ = launch
    if args.stub_cuda:
        stub_cuda()
    device = torch.device(args.device)
    backend = args.backend or None
    costs = launch_costs(device, args.repeats) if args.launch_costs else None
    mod, module = module_step(args.heads, args.batch, args.length, backend, device, args.dims,
                              getattr(torch, args.dtype))
    layer = layer_step(mod, args.batch, args.length, backend)
    inner = decode_step(mod, args.batch, args.length, backend)
    print(f"mla_core at {os.path.dirname(mla_core.__file__)}, torch {torch.__version__}, {args.device}, "
          f"{args.dims} dims, {args.dtype}, heads {args.heads}, batch {args.batch}, length {args.length}, "
          f"backend {backend or 'automatic'}{' (Triton launches stubbed)' if args.stub_triton else ''}"
          f"{' (cuda calls stubbed)' if args.stub_cuda else ''}")
    rows = []
    before = os.environ.get("MLA_CORE_CHECKS")
    try:
        for checks in ("full", "metadata"):
            os.environ["MLA_CORE_CHECKS"] = checks
            for what, fn in (("decode op", inner), ("mla_forward", layer), ("MLAAttention", module)):
                if args.only and what not in args.only.split(","):
                    continue
                median, least = per_call_us(fn, device, repeats=args.repeats,
                                            clock=time.thread_time if args.clock == "thread" else time.perf_counter)
                rows.append(dict(what=what, checks=checks, us=median, min_us=least))
                print(f"{what:>13} [{checks:>8}]  median {median:8.1f} µs/call  (min {least:8.1f})", flush=True)
                if args.count:
                    rows[-1].update(count(fn))
                    print(f"{'':>13}   {rows[-1]['python_calls']} Python calls, {rows[-1]['device_ops']} device ops "
                          f"({' '.join(rows[-1]['device_op_names'])}), {rows[-1]['triton_launches']} stubbed launches",
                          flush=True)
                if args.profile:
                    print(profile(fn, args.profile, sort=args.profile_sort))
                if args.torch_profile:
                    print(torch_profile(fn, args.torch_profile, device))
    finally:
        if before is None:
            os.environ.pop("MLA_CORE_CHECKS")
        else:
            os.environ["MLA_CORE_CHECKS"] = before
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(args), rows=rows, launch_costs=costs), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
