"""No op depends on torch's global default dtype or device.

Model loaders call ``torch.set_default_dtype(torch.bfloat16)`` and ``torch.set_default_device("cuda")``, or
enter ``with torch.device("cuda"):``, and then call mla_core. Every public op (and the tuner's input builder,
``mla_core.inputs.make_call``) must give the same result, bit for bit, as under float32 / CPU defaults:
every tensor a library path makes names its dtype and device. Inputs are built once, before the defaults
change; each case then runs under plain defaults and under the changed ones.

CPU: bf16 default dtype (reference, and triton under the interpreter where it implements the op).
GPU (``-m gpu``): ``torch.set_default_device("cuda")``, ``with torch.device("cuda")``, and both with bf16.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import pytest
import torch

import mla_core
from mla_core import inputs, specs
from paged_inputs import paged_decode_inputs

FP8 = torch.float8_e4m3fn
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# ------------------------------------------------------------------------------------------------
# one small case per op and recipe: a function of (device, backend) returning a runner of no arguments


def decode_case(recipe):
    quant = dict(k_qdq="nvfp4", k_qdq_amax=3.0, v_qdq="fp8", v_qdq_amax=2.5, p_qdq="nvfp4") if recipe else {}

    def build(device, backend):
        q, cache, table, lens = paged_decode_inputs([5, 0, 33, 12], heads=2, dim=48, page_size=4,
                                                    dtype=torch.float32, device=device)
        return lambda: mla_core.mla_decode(q, cache, table, lens, softmax_scale=0.2, kv_lora_rank=32,
                                           qk_rope_head_dim=16, num_kv_splits=2, backend=backend, **quant)
    return build


def prefill_case(recipe):
    quant = dict(q_quant="fp8", q_amax=4.0, k_quant="nvfp4", k_amax=4.0, p_quant="nvfp4", v_quant="fp8",
                 v_amax=4.0, sparsity_n=2, sparsity_m=4, dense_sink_tokens=1, dense_recent_tokens=2) if recipe else {}

    def build(device, backend):
        a = inputs.prefill_inputs([3, 0, 17], [4, 2, 20], heads=2, kv_heads=1, qk_dim=24, v_dim=16,
                                  dtype=torch.float32, device=device)
        return lambda: mla_core.mla_prefill(**a, causal=True, return_lse=True, block_m=16, block_n=16,
                                            backend=backend, **quant)
    return build


def merge_case(_recipe):
    def build(device, backend):
        a = inputs.merge_inputs(6, heads=2, head_dim=8, dtype=torch.float32, device=device)
        return lambda: mla_core.merge_attn_states(**a, backend=backend)
    return build


def rope_case(recipe):
    def build(device, backend):
        a = inputs.rope_inputs(5, heads=2, rope_dim=8, nope_dim=16, max_pos=12, dtype=torch.bfloat16,
                               device=device)
        return lambda: mla_core.mla_rope_quantize_fp8(**a, is_neox=bool(recipe), quant_scale_q=0.5,
                                                      quant_scale_kv=2.0, backend=backend)
    return build


def sparse_case(recipe):
    def build(device, backend):
        a = inputs.sparse_decode_inputs(2, q_len=2, heads=2, top_k=64, num_pages=2, page_size=16,
                                        seq_lens=[30, 64], device=device)
        if recipe:  # with reusable metadata
            a["metadata"] = mla_core.get_sparse_decode_metadata(a["query"], a["seq_lens"], 64)
        return lambda: mla_core.sparse_mla_fp8_decode(**a, return_lse=True, backend=backend)
    return build


def metadata_case(recipe):
    def build(device, backend):
        query = torch.zeros(3, 1, 2, 576, dtype=FP8, device=device)
        lens = torch.tensor([0, 64, 9], dtype=torch.int32, device=device) if recipe else None
        return lambda: mla_core.get_sparse_decode_metadata(query, lens, 64)
    return build


def make_call_case(op):
    """The autotuner's builder: a validated call of a problem's shape, drawn from a seeded generator."""
    def problem(device):
        if op == "decode":
            a = paged_decode_inputs([5, 12], heads=2, dim=48, page_size=4, device=device)
            return specs.validate_decode(*a, softmax_scale=0.2, kv_lora_rank=32, qk_rope_head_dim=16, page_size=None,
                                         num_kv_splits=2, k_qdq="nvfp4", k_qdq_amax=None, v_qdq="fp8", v_qdq_amax=None,
                                         p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)[0]
        if op == "prefill":
            a = inputs.prefill_inputs([3, 5], heads=2, qk_dim=24, v_dim=16, dtype=torch.float32, device=device)
            return specs.validate_prefill(*a.values(), None, True, True, q_quant="fp8", k_quant=None, p_quant=None,
                                          v_quant="nvfp4", q_amax=1.0, k_amax=None, p_amax=1.0, v_amax=1.0,
                                          sparsity_n=0, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64,
                                          block_m=16, block_n=16)[0]
        if op == "merge":
            return specs.validate_merge(*inputs.merge_inputs(4, heads=2, head_dim=8, device=device).values(),
                                        None, None)[0]
        if op == "rope_quantize_fp8":
            a = inputs.rope_inputs(4, heads=2, rope_dim=8, nope_dim=16, max_pos=16, device=device)
            return specs.validate_rope_quantize(*a.values(), True, None, 1.0, 1.0, None, None, None, None)[0]
        a = inputs.sparse_decode_inputs(2, heads=2, top_k=64, num_pages=2, device=device)
        return specs.validate_sparse_decode(a["query"], a["kv_cache"], 128, 512, 64, a["block_tables"], a["seq_lens"],
                                            64, None, 1.0, 1.0, None, True, None)[0]

    def build(device, backend):
        p = problem(device)

        def run():
            call = inputs.make_call(p, device=device, seed=3)
            fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
            if "metadata" in fields:
                fields["metadata"] = dataclasses.asdict(fields["metadata"])
            result = mla_core.plugins.registry().backends[backend].run(p, call, {})
            return fields, result
        return run
    return build


CASES = {
    "decode": (decode_case, ("reference", "triton")),
    "prefill": (prefill_case, ("reference", "triton")),
    "merge": (merge_case, ("reference", "triton")),
    "rope_quantize_fp8": (rope_case, ("reference",)),
    "sparse_decode": (sparse_case, ("reference",)),
    "sparse_metadata": (metadata_case, (None,)),
}
MAKE_CALL_OPS = ("decode", "prefill", "merge", "rope_quantize_fp8", "sparse_decode")

PARAMS = [pytest.param(op, recipe, backend, id=f"{op}-{'quant' if recipe else 'plain'}-{backend}")
          for op, (_, backends) in CASES.items() for recipe in (False, True) for backend in backends
          if not (op == "merge" and recipe)]
MAKE_CALL_PARAMS = [pytest.param(op, id=f"make_call-{op}") for op in MAKE_CALL_OPS]

# Open items: cases that fail today because of library code, left out until the fix lands (each names the line).
# (test name, parameter id) -> what is open.
OPEN: dict[tuple[str, str], str] = {}


def open_items(kind: str, params: list) -> list:
    """``params`` less the ids an OPEN entry names for tests of ``kind``."""
    return [p for p in params if not any(k == kind and i in p.id for k, i in OPEN)]


def flatten(x, prefix="out"):
    """Every tensor / scalar in a result as (path, value), for an exact comparison."""
    if isinstance(x, torch.Tensor):
        return [(prefix, x)]
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in flatten(v, f"{prefix}.{k}")]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return flatten(dataclasses.asdict(x), prefix)
    if isinstance(x, (tuple, list)):
        return [p for i, v in enumerate(x) for p in flatten(v, f"{prefix}[{i}]")]
    return [(prefix, x)]


def assert_identical(got, want):
    g, w = flatten(got), flatten(want)
    assert [p for p, _ in g] == [p for p, _ in w]
    for (path, a), (_, b) in zip(g, w):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor), path
            assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), path
            a, b = a.cpu(), b.cpu()
            if a.dtype == FP8:
                a, b = a.view(torch.uint8), b.view(torch.uint8)
            assert torch.equal(a.isnan(), b.isnan()), f"{path}: NaN at other places"
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), f"{path}: values differ"
        elif isinstance(b, float) and math.isnan(b):
            assert isinstance(a, float) and math.isnan(a), path
        else:
            assert a == b, path


def runner(op, recipe, backend, device):
    build, _ = CASES[op]
    return build(recipe)(device, backend)


def check_under(global_defaults, run, dtype=None, device=None, context=None):
    """``run()`` under plain defaults, then under the changed ones (set_default_* and/or a device context)."""
    want = run()
    global_defaults(dtype=dtype, device=device)
    with context if context is not None else contextlib.nullcontext():
        got = run()
    assert_identical(got, want)


# ------------------------------------------------------------------------------------------------
# CPU: bf16 default dtype


def needs_interpreter(backend):
    if backend == "triton" and not INTERPRETED:
        pytest.skip("the CPU variant of triton runs under TRITON_INTERPRET=1")


@pytest.mark.parametrize("op,recipe,backend", PARAMS)
def test_bf16_default_dtype_cpu(global_defaults, op, recipe, backend):
    needs_interpreter(backend)
    check_under(global_defaults, runner(op, recipe, backend, "cpu"), dtype=torch.bfloat16)


@pytest.mark.parametrize("op", MAKE_CALL_PARAMS)
def test_make_call_bf16_default_dtype_cpu(global_defaults, op):
    build = make_call_case(op)
    check_under(global_defaults, build("cpu", "reference"), dtype=torch.bfloat16)


def test_fixture_restores_the_defaults(global_defaults):
    global_defaults(dtype=torch.float16)
    assert torch.get_default_dtype() == torch.float16


def test_defaults_were_restored():
    assert torch.get_default_dtype() == torch.float32 and torch.empty(1).device.type == "cpu"


# ------------------------------------------------------------------------------------------------
# GPU: default device cuda (set_default_device and the `with torch.device` context), alone and with bf16

GPU_MODES = {
    "set_default_device": dict(device="cuda"),
    "with_device": dict(context="cuda"),
    "set_default_device_bf16": dict(device="cuda", dtype=torch.bfloat16),
    "with_device_bf16": dict(context="cuda", dtype=torch.bfloat16),
}


def gpu_check(global_defaults, run, mode):
    kw = dict(GPU_MODES[mode])
    if "context" in kw:
        kw["context"] = torch.device(kw["context"])
    check_under(global_defaults, run, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(GPU_MODES))
@pytest.mark.parametrize("op,recipe,backend", open_items("default_device", PARAMS))
def test_cuda_default_device_gpu(global_defaults, op, recipe, backend, mode):
    gpu_check(global_defaults, runner(op, recipe, backend, "cuda"), mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(GPU_MODES))
@pytest.mark.parametrize("op", open_items("default_device", MAKE_CALL_PARAMS))
def test_make_call_cuda_default_device_gpu(global_defaults, op, mode):
    gpu_check(global_defaults, make_call_case(op)("cuda", "reference"), mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(GPU_MODES))
def test_cpu_inputs_under_cuda_default_device_gpu(global_defaults, mode):
    """CPU inputs while the default device is cuda: every op still runs on the CPU (reference)."""
    for op, recipe in (("decode", True), ("prefill", True), ("merge", False), ("rope_quantize_fp8", True),
                       ("sparse_decode", True), ("sparse_metadata", True)):
        if not open_items("default_device", [pytest.param(id=op)]):
            continue
        run = runner(op, recipe, None if op == "sparse_metadata" else "reference", "cpu")
        gpu_check(global_defaults, run, mode)
        global_defaults(dtype=torch.float32, device=None)
        torch.set_default_device(None)


# ------------------------------------------------------------------------------------------------
# CPU stand-in for a cuda default device: the "meta" device (no data) as the default, CPU inputs. A tensor a
# library path makes without naming its device lands on meta and fails beside the CPU inputs, as it would on
# the GPU machine beside a CPU copy of the lengths.


@pytest.mark.parametrize("op,recipe,backend", open_items("default_device", PARAMS))
def test_meta_default_device_cpu(global_defaults, op, recipe, backend):
    needs_interpreter(backend)
    check_under(global_defaults, runner(op, recipe, backend, "cpu"), device="meta")


@pytest.mark.parametrize("op", open_items("default_device", MAKE_CALL_PARAMS))
def test_make_call_meta_default_device_cpu(global_defaults, op):
    check_under(global_defaults, make_call_case(op)("cpu", "reference"), device="meta")


# ------------------------------------------------------------------------------------------------
# the input builders `mla-core check` and `mla-core demo` run (mla_core.inputs): same tensors whatever the defaults

BUILDERS = {
    "decode_inputs": lambda device: inputs.decode_inputs([5, 17], heads=2, page_size=4, kv_lora_rank=32, rope_dim=16,
                                                         device=device),
    "prefill_inputs": lambda device: inputs.prefill_inputs([3, 5], heads=2, qk_dim=24, v_dim=16, device=device),
    "merge_inputs": lambda device: inputs.merge_inputs(4, heads=2, head_dim=8, device=device),
    "rope_inputs": lambda device: inputs.rope_inputs(4, heads=2, rope_dim=8, nope_dim=16, max_pos=16, device=device),
    "sparse_decode_inputs": lambda device: inputs.sparse_decode_inputs(2, heads=2, top_k=64, num_pages=2,
                                                                       device=device),
}


@pytest.mark.parametrize("name", open_items("builders_bf16", [pytest.param(n, id=n) for n in BUILDERS]))
def test_input_builders_bf16_default_dtype_cpu(global_defaults, name):
    check_under(global_defaults, lambda: BUILDERS[name]("cpu"), dtype=torch.bfloat16)


DEVICE_BUILDERS = open_items("builders_device", [pytest.param(n, id=n) for n in BUILDERS])


@pytest.mark.parametrize("name", DEVICE_BUILDERS)
def test_input_builders_meta_default_device_cpu(global_defaults, name):
    check_under(global_defaults, lambda: BUILDERS[name]("cpu"), device="meta")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(GPU_MODES))
@pytest.mark.parametrize("name", DEVICE_BUILDERS)
def test_input_builders_cuda_default_device_gpu(global_defaults, name, mode):
    gpu_check(global_defaults, lambda: BUILDERS[name]("cuda"), mode)


