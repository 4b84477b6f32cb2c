"""Op specs: argument validation, the validated call objects backends receive, and their ``Problem``.

Every public op validates here, before any kernel runs, and raises :class:`MLAInputError` naming the
argument, what it got and what it needs. Metadata checks (shapes, dtypes, devices, strides) are
always on and never synchronize with the device. Content checks (lengths against capacity, table
entries in range, ``pos_ids`` in range) read tensor values; they run in eager calls unless
``MLA_CORE_CHECKS=metadata`` and never during CUDA graph capture.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import env, numerics
from .errors import MLAInputError
from .problem import Problem, dtype_name

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
FP8 = torch.float8_e4m3fn
ENV_CHECKS = "MLA_CORE_CHECKS"
AUTO = "auto"
INT32_MAX = 2 ** 31 - 1
"""Largest length, offset or count a kernel holds (kernels index in int32 within a sequence)."""
FLOAT32_MIN_NORMAL = 2.0 ** -126
FLOAT32_MAX = 3.4028234663852886e38
"""Float scalars (scales, amaxes) must lie in float32's normal range: kernels hold them as float32."""


# --------------------------------------------------------------------------------------------------
# small validators


def _names(dtypes) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def check_tensor(name: str, x: Any, ndim: int | tuple[int, ...], dtypes=None) -> torch.Tensor:
    """``x`` is a tensor of rank ``ndim`` (or one of them), dtype in ``dtypes``, last dimension contiguous."""
    if not isinstance(x, torch.Tensor):
        raise MLAInputError(f"{name}: got {type(x).__name__}, needs a torch.Tensor")
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if x.dim() not in ndims:
        raise MLAInputError(f"{name}: got rank {x.dim()} (shape {tuple(x.shape)}), needs rank {' or '.join(map(str, ndims))}")
    if dtypes is not None and x.dtype not in dtypes:
        raise MLAInputError(f"{name}: got dtype {dtype_name(x.dtype)}, needs one of {_names(dtypes)}")
    if x.dim() and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise MLAInputError(f"{name}: got strides {tuple(x.stride())} (last dimension not contiguous), needs stride 1 "
                            f"in the last dimension; pass {name}.contiguous()")
    return x


def check_contiguous(name: str, x: torch.Tensor) -> None:
    """``x`` is contiguous in every dimension."""
    if not x.is_contiguous():
        raise MLAInputError(f"{name}: got a non-contiguous tensor (shape {list(x.shape)}, strides {tuple(x.stride())}), "
                            f"needs a contiguous one; pass {name}.contiguous()")


def check_shape(name: str, x: torch.Tensor, shape: tuple) -> None:
    """``x.shape`` equals ``shape``; None entries in ``shape`` match any size."""
    if len(x.shape) != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise MLAInputError(f"{name}: got shape {list(x.shape)}, needs {want}")


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """Every given tensor is on one device; returns it."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for n, t in items[1:]:
        if t.device != first.device:
            raise MLAInputError(f"{n}: got device {t.device}, needs the device of {first_name} ({first.device})")
    return first.device


def check_int(name: str, v: Any, lo: int, hi: int | None = None) -> int:
    """``v`` is an int (not bool) in ``[lo, hi]``."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise MLAInputError(f"{name}: got {v!r}, needs an int")
    if v < lo or (hi is not None and v > hi):
        raise MLAInputError(f"{name}: got {v}, needs {lo}..{hi}" if hi is not None else f"{name}: got {v}, needs >= {lo}")
    return v


def check_positive_float(name: str, v: Any, allow_none: bool = False) -> float | None:
    """``v`` is a positive real number in float32's normal range, 2^-126..3.4e38 (or None when allowed).

    Kernels hold every scalar as float32: a value past that range would become inf or a subnormal (or 0)
    there and give NaN or a silently different quantization.
    """
    if v is None and allow_none:
        return None
    want = "a positive float in float32's normal range (1.18e-38..3.4e38)" + (" or None" if allow_none else "")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MLAInputError(f"{name}: got {v!r}, needs {want}")
    try:
        f = float(v)
    except OverflowError:
        raise MLAInputError(f"{name}: got {v!r}, needs {want}") from None
    if not math.isfinite(f) or not FLOAT32_MIN_NORMAL <= f <= FLOAT32_MAX:
        raise MLAInputError(f"{name}: got {f}, needs {want}")
    return f


def check_format(name: str, fmt: Any) -> str | None:
    """``fmt`` is None or one of :data:`mla_core.numerics.QUANT_FORMATS`."""
    if fmt is not None and fmt not in numerics.QUANT_FORMATS:
        raise MLAInputError(f"{name}: got {fmt!r}, needs None, 'fp8' or 'nvfp4'")
    return fmt


def check_dtype_arg(name: str, dtype: Any, allowed) -> torch.dtype:
    if dtype not in allowed:
        raise MLAInputError(f"{name}: got {dtype!r}, needs one of {_names(allowed)}")
    return dtype


def check_has_data(name: str, x: torch.Tensor) -> None:
    """An eager call's tensors hold data: the meta device only while torch.compile traces (fake tensors)."""
    if x.device.type == "meta" and not (torch.compiler.is_compiling() or isinstance(x, FakeTensor)):
        raise MLAInputError(f"{name}: got a tensor on the meta device (no data), needs a tensor on a device that "
                            "holds data (cpu, cuda); meta tensors are only for torch.compile tracing")


_VALUES_CHECKED = contextvars.ContextVar("mla_core_values_checked", default=False)


@contextlib.contextmanager
def values_checked():
    """Inside the block ops skip their value checks: for a caller that checked (or derived) every value it passes,
    as the fused layer does for its inner mla_decode / mla_prefill (one host sync per call instead of two)."""
    token = _VALUES_CHECKED.set(True)
    try:
        yield
    finally:
        _VALUES_CHECKED.reset(token)


def content_checks_enabled(*tensors: torch.Tensor) -> bool:
    """Whether value checks (which read device memory) run for this call."""
    if env.checks_mode() == "metadata" or _VALUES_CHECKED.get():  # (raises MLAInputError on a bad MLA_CORE_CHECKS)
        return False
    if torch.compiler.is_compiling() or any(isinstance(t, FakeTensor) for t in tensors):
        return False  # tracing: no values to read (the compiled op checks them when it runs)
    if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
        return False
    return True


def _cu_seqlens(name: str, cu: torch.Tensor, total: int, batch: int) -> torch.Tensor:
    c = cu.to("cpu", torch.int64)
    if int(c[0]) != 0:
        raise MLAInputError(f"{name}: got first entry {int(c[0])}, needs 0")
    lens = c[1:] - c[:-1]
    if batch and int(lens.min()) < 0:
        raise MLAInputError(f"{name}: got decreasing entries {c.tolist()[:16]}, needs non-decreasing cumulative lengths")
    if int(c[-1]) != total:
        raise MLAInputError(f"{name}: got last entry {int(c[-1])}, needs the packed token count {total}")
    return lens


# --------------------------------------------------------------------------------------------------
# decode


@dataclass
class DecodeCall:
    """Validated arguments of :func:`mla_core.mla_decode`.

    q [batch, heads, kv_lora_rank + rope_dim] (bf16/fp16, or fp32 carrier); latent_cache
    [num_pages, page_size, kv_lora_rank + rope_dim]; block_table [batch, max_pages]; seq_lens [batch];
    ``num_kv_splits`` an int, or None for "auto" (the config or a heuristic picks it: see
    :func:`decode_num_splits`); out / lse: None (allocate) or tensors to write. ``kv_scale``: the
    per-tensor scale of a float8_e4m3fn cache (values ``code * kv_scale``), None for a float cache.
    """

    q: torch.Tensor
    latent_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    softmax_scale: float
    kv_lora_rank: int
    rope_dim: int
    page_size: int
    num_kv_splits: int | None
    k_qdq: str | None
    k_amax: float | None
    v_qdq: str | None
    v_amax: float | None
    p_qdq: str | None
    p_amax: float
    return_lse: bool
    out_dtype: torch.dtype
    kv_scale: float | None = None


@dataclass
class LayerDecodePrep:
    """The fused layer's decode prep, for a backend that runs it inside its own decode call
    (:meth:`mla_core.Backend.run_decode_with_prep`) instead of the layer launching it separately.

    One token per request: token t of request t (``input_row_offsets`` [batch + 1] = 0..batch) at position
    ``cache_offsets[t]``. Before the decode reads them, the prep writes (a) the new cache row of each request:
    RMSNorm of ``kv[t, :latent]`` with ``kv_norm_gamma`` [latent] and ``epsilon``, then RoPE of ``kv[t, latent:]``
    with ``freqs_cis`` [positions, rope] float32 (cos | sin halves; ``rope_interleave``: pairs (2i, 2i + 1), else
    halves), at its page of the decode call's block table; (b) q_src [batch, heads, nope + rope]'s rope part,
    rotated the same way, into the decode call's ``q[:, :, latent:]``; (c) the decode call's ``seq_lens`` =
    position + 1. Its float32 arithmetic is the layer's own prep's, operation for operation (docs/layer.md):
    ``sum_order`` (a thread's four squares: 0 a tree, 1 a left fold from x0, 2 a left fold from x1) names the order
    the layer's prep compiles to, so the two paths are bit-equal; the rotation is ``fma(cos, x1, -(sin * x2))``,
    ``fma(sin, x1, cos * x2)`` on every version (the layer writes it out).
    """

    q_src: torch.Tensor
    kv: torch.Tensor
    input_row_offsets: torch.Tensor
    cache_offsets: torch.Tensor
    freqs_cis: torch.Tensor
    kv_norm_gamma: torch.Tensor
    epsilon: float
    rope_interleave: bool
    sum_order: int


DEFAULT_SM_COUNT = 132
"""Multiprocessors assumed off a CUDA device (H100 / H200 SXM): CPU interpreter runs and other device types
plan their split counts as on the GPU they stand in for."""
_SM_COUNTS: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """The multiprocessor count of a CUDA ``device`` (asked once per device index), else :data:`DEFAULT_SM_COUNT`."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNTS:
        _SM_COUNTS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNTS[idx]


def decode_num_splits(call: DecodeCall, config: dict[str, Any], sm_count: int = DEFAULT_SM_COUNT,
                      resident_ctas: int = 2, max_fill: int = numerics.MAX_KV_SPLITS) -> int:
    """Split count for one decode call: the caller's int; for "auto" the config's, else enough to fill the GPU.

    The fill: ``batch * ceil(heads / 64) * splits`` CTAs against ``resident_ctas`` per SM (rounded up for
    kernels that keep two CTAs on an SM; for one, rounded down so the grid stays one wave, with at least 2 steps of
    64 keys per split and 64-head group: the partials each split writes and the combine reads grow with the head
    count, docs/decisions.md), at most ``max_fill`` (:data:`numerics.MAX_KV_SPLITS`, lower for a kernel whose
    measured best stops short of it) and the 32-key tiles the block table can hold.
    """
    if call.num_kv_splits is not None:
        return call.num_kv_splits
    if "num_kv_splits" in config:
        return int(config["num_kv_splits"])
    batch, heads = call.q.shape[0], call.q.shape[1]
    head_groups = max(1, -(-heads // 64))
    max_tiles = max(1, -(-(call.block_table.shape[1] * call.page_size) // numerics.DECODE_P_TILE))
    if resident_ctas == 1:
        want = max(1, sm_count // max(1, batch * head_groups))
        max_tiles = max(1, -(-max_tiles // (4 * head_groups)))
    else:
        want = max(1, -(-resident_ctas * sm_count // max(1, batch * head_groups)))
    return max(1, min(max_fill, numerics.MAX_KV_SPLITS, want, max_tiles))


AUTO_SPLIT_CHOICES = (1, 2, 4, 8, 16, 32)
"""Decode split counts a backend lists for ``num_kv_splits="auto"`` at any shape (see :func:`auto_split_choices`)."""
WIDE_SPLIT_CHOICES = (64, 128)
"""Split counts above 32 (up to :data:`numerics.MAX_KV_SPLITS`), listed only where they can fill the GPU."""


def auto_split_choices(problem: Any, head_tile: int = 64, sm_count: int = DEFAULT_SM_COUNT) -> tuple[int, ...]:
    """Split counts to tune for a decode key with ``num_kv_splits="auto"``: :data:`AUTO_SPLIT_CHOICES`, plus each of
    :data:`WIDE_SPLIT_CHOICES` where ``batch * ceil(heads / head_tile) * splits <= 2 * sm_count`` (the key's batch
    bucket: small-batch keys, where 32 splits leave most SMs idle; large-batch keys gain no configs, so their
    warm-up does not grow) and each split keeps at least 4 tiles of 32 keys (two 64-key steps) per 64-head group of
    the key's ``max_len`` (the rule of :func:`decode_num_splits` for one CTA per SM)."""
    batch, heads = int(problem.get("batch", 1)), int(problem.get("heads", 1))
    tiles = -(-int(problem.get("max_len", 1)) // numerics.DECODE_P_TILE)
    groups = max(1, -(-heads // head_tile))
    wide = tuple(s for s in WIDE_SPLIT_CHOICES
                 if s <= numerics.MAX_KV_SPLITS and batch * groups * s <= 2 * sm_count and 4 * groups * s <= tiles)
    return AUTO_SPLIT_CHOICES + wide


def _check_kv_scale(kv_scale: Any, cache_dtype: torch.dtype) -> float | None:
    """``kv_scale`` is a host float with an FP8 cache (required) and None with a float cache.

    A host float, as FlashInfer's ``bmm1_scale`` / ``bmm2_scale`` and vLLM's ``_k_scale_float``: it is
    checked here without a device sync, is part of no dispatch key, and a CUDA graph bakes it in (a
    calibrated per-tensor scale is fixed once the model is loaded).
    """
    if cache_dtype != FP8:
        if kv_scale is not None:
            raise MLAInputError(f"kv_scale: got {kv_scale!r} with a {dtype_name(cache_dtype)} latent_cache, needs None "
                                "(kv_scale dequantizes a float8_e4m3fn cache; a float cache holds its values)")
        return None
    if kv_scale is None:
        raise MLAInputError("kv_scale: got None with a float8_e4m3fn latent_cache, needs the cache's per-tensor scale "
                            "as a positive python float (cache value = code * kv_scale; 1.0 for raw codes)")
    if isinstance(kv_scale, torch.Tensor):
        raise MLAInputError(f"kv_scale: got a tensor of shape {list(kv_scale.shape)} on {kv_scale.device}, needs a "
                            "python float (pass float(kv_scale) once after calibration: a device tensor could only be "
                            "checked with a sync)")
    return check_positive_float("kv_scale", kv_scale)


def validate_decode(q, latent_cache, block_table, b_seq_len, *, softmax_scale, kv_lora_rank, qk_rope_head_dim,
                    page_size, num_kv_splits, k_qdq, k_qdq_amax, v_qdq, v_qdq_amax, p_qdq, p_qdq_amax,
                    return_lse, out_dtype, kv_scale=None) -> tuple[Problem, DecodeCall]:
    check_tensor("latent_cache", latent_cache, 3, FLOAT_DTYPES + (FP8,))
    if latent_cache.dtype == FP8:
        check_tensor("q", q, 3)
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise MLAInputError(f"q: got dtype {dtype_name(q.dtype)} with a float8_e4m3fn latent_cache, needs "
                                "bfloat16 or float16 (the FP8 codes enter q's dtype exactly); pass q.bfloat16()")
    else:
        check_tensor("q", q, 3, (latent_cache.dtype, torch.float32))
    check_tensor("block_table", block_table, 2, INDEX_DTYPES)
    check_tensor("b_seq_len", b_seq_len, 1, INDEX_DTYPES)
    device = check_same_device(q=q, latent_cache=latent_cache, block_table=block_table, b_seq_len=b_seq_len)
    check_has_data("q", q)
    check_int("kv_lora_rank", kv_lora_rank, 1)
    check_int("qk_rope_head_dim", qk_rope_head_dim, 0)
    dim = kv_lora_rank + qk_rope_head_dim
    batch, heads = q.shape[0], q.shape[1]
    check_shape("q", q, (None, None, dim))
    if heads < 1:
        raise MLAInputError(f"q: got {heads} heads, needs at least 1")
    num_pages, cache_page = latent_cache.shape[0], latent_cache.shape[1]
    check_shape("latent_cache", latent_cache, (None, None, dim))
    if cache_page < 1:
        raise MLAInputError(f"latent_cache: got page size {cache_page}, needs at least 1")
    if page_size is None:
        page_size = cache_page
    check_int("page_size", page_size, 1)
    if page_size != cache_page:
        raise MLAInputError(f"page_size: got {page_size}, needs latent_cache.shape[1] = {cache_page}")
    check_shape("block_table", block_table, (batch, None))
    check_shape("b_seq_len", b_seq_len, (batch,))
    softmax_scale = check_positive_float("softmax_scale", softmax_scale)
    if num_kv_splits == AUTO:
        splits = None
    else:
        splits = check_int("num_kv_splits", num_kv_splits, 1, numerics.MAX_KV_SPLITS)
    k_qdq, v_qdq, p_qdq = check_format("k_qdq", k_qdq), check_format("v_qdq", v_qdq), check_format("p_qdq", p_qdq)
    k_amax = check_positive_float("k_qdq_amax", k_qdq_amax, allow_none=True)
    v_amax = check_positive_float("v_qdq_amax", v_qdq_amax, allow_none=True)
    p_amax = check_positive_float("p_qdq_amax", p_qdq_amax)
    kv_scale = _check_kv_scale(kv_scale, latent_cache.dtype)
    if not isinstance(return_lse, bool):
        raise MLAInputError(f"return_lse: got {return_lse!r}, needs a bool")
    value_dtype = numerics.decode_value_dtype(latent_cache.dtype, q.dtype)
    out_dtype = value_dtype if out_dtype is None else check_dtype_arg("out_dtype", out_dtype, FLOAT_DTYPES)
    capacity = block_table.shape[1] * page_size
    if capacity > INT32_MAX:
        raise MLAInputError(f"block_table: got {block_table.shape[1]} pages of {page_size} tokens per request "
                            f"({capacity} tokens), needs at most {INT32_MAX} tokens (int32 lengths)")
    if batch and content_checks_enabled(b_seq_len):
        lens = b_seq_len.to("cpu", torch.int64)
        lo, hi = int(lens.min()), int(lens.max())
        if lo < 0 or hi > capacity:
            bad = lo if lo < 0 else hi
            raise MLAInputError(f"b_seq_len: got a length {bad}, needs 0..{capacity} "
                                f"(block_table.shape[1] * page_size = {block_table.shape[1]} * {page_size})")
        used = (lens + page_size - 1) // page_size
        cols = torch.arange(block_table.shape[1], device="cpu")  # beside lens, whatever torch's default device
        reached = cols[None, :] < used[:, None]
        entries = block_table.to("cpu", torch.int64)[reached]
        if entries.numel() and (int(entries.min()) < 0 or int(entries.max()) >= num_pages):
            bad = int(entries.min()) if int(entries.min()) < 0 else int(entries.max())
            raise MLAInputError(f"block_table: got page index {bad} within a request's length, needs 0..{num_pages - 1} "
                                "(the latent_cache page count)")
    features = {"lse"} if return_lse else set()
    if q.dtype == torch.float32 and latent_cache.dtype != torch.float32:
        features.add("fp32_q")
    if kv_scale is not None and (k_qdq or v_qdq):
        features.add("kv_qdq_fp8_cache")
    problem = Problem.make(
        "decode", device.type, features,
        dtype=dtype_name(latent_cache.dtype), q_dtype=dtype_name(q.dtype), out_dtype=dtype_name(out_dtype),
        heads=heads, kv_lora_rank=kv_lora_rank, rope_dim=qk_rope_head_dim, page_size=page_size,
        num_kv_splits=AUTO if splits is None else splits,
        k_qdq=k_qdq, v_qdq=v_qdq, p_qdq=p_qdq,
        batch=numerics.bucket_pow2(batch), max_len=numerics.bucket_pow2(capacity))
    call = DecodeCall(q, latent_cache, block_table, b_seq_len, softmax_scale, kv_lora_rank, qk_rope_head_dim,
                      page_size, splits, k_qdq, k_amax, v_qdq, v_amax, p_qdq, p_amax, return_lse, out_dtype,
                      kv_scale)
    return problem, call


# --------------------------------------------------------------------------------------------------
# prefill


@dataclass
class PrefillCall:
    """Validated arguments of :func:`mla_core.mla_prefill`.

    q [total_q, heads, qk_dim]; k [total_k, kv_heads, qk_dim]; v [total_k, kv_heads, v_dim];
    cu_seqlens_q / cu_seqlens_k [batch + 1]; quant formats and amaxes per operand; N:M sparsity
    (``sparsity_n`` 0 = off); ``block_n`` is also the P tile (numerics), ``block_m`` only speed.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    softmax_scale: float
    causal: bool
    return_lse: bool
    q_quant: str | None
    k_quant: str | None
    p_quant: str | None
    v_quant: str | None
    q_amax: float | None
    k_amax: float | None
    p_amax: float
    v_amax: float | None
    sparsity_n: int
    sparsity_m: int
    dense_sink_tokens: int
    dense_recent_tokens: int
    block_m: int
    block_n: int


def prefill_dense_batch(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                        max_seqlen_q: int) -> bool:
    """Whether shapes alone prove a prefill batch dense: every sequence has the same len_q and the same len_k.

    True for at most one sequence (its lengths are total_q and total_k), and for ``cu_seqlens_q`` and
    ``cu_seqlens_k`` the same memory with ``total_q == total_k == batch * max_seqlen_q`` (``max_seqlen_q``
    bounds each length, so each is exactly ``max_seqlen_q``). No value is read: a caller whose
    ``max_seqlen_q`` lies (caught by content checks, not in ``metadata`` mode) gets wrong values, never an
    access outside q / k / v.
    """
    batch = cu_seqlens_q.shape[0] - 1
    if batch <= 1:
        return True
    if not (q.shape[0] == k.shape[0] == batch * max_seqlen_q):
        return False
    a, b = cu_seqlens_q, cu_seqlens_k
    if a is b:
        return True
    if isinstance(a, FakeTensor) or isinstance(b, FakeTensor) or a.device.type == "meta":
        return False
    return a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.stride() == b.stride()


def validate_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse, *,
                     q_quant, k_quant, p_quant, v_quant, q_amax, k_amax, p_amax, v_amax, sparsity_n, sparsity_m,
                     dense_sink_tokens, dense_recent_tokens, block_m, block_n) -> tuple[Problem, PrefillCall]:
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k", k, 3, (q.dtype,))
    check_tensor("v", v, 3, (q.dtype,))
    check_tensor("cu_seqlens_q", cu_seqlens_q, 1, INDEX_DTYPES)
    check_tensor("cu_seqlens_k", cu_seqlens_k, 1, INDEX_DTYPES)
    device = check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    check_has_data("q", q)
    total_q, heads, qk_dim = q.shape
    total_k, kv_heads = k.shape[0], k.shape[1]
    for name, total in (("q", total_q), ("k", total_k)):
        if total > INT32_MAX:
            raise MLAInputError(f"{name}: got {total} packed tokens, needs at most {INT32_MAX} (int32 offsets)")
    if heads < 1 or qk_dim < 1:
        raise MLAInputError(f"q: got shape {list(q.shape)}, needs at least one head and one feature")
    check_shape("k", k, (None, None, qk_dim))
    if kv_heads < 1 or heads % kv_heads:
        raise MLAInputError(f"k: got {kv_heads} kv heads, needs a divisor of q's {heads} heads")
    check_shape("v", v, (total_k, kv_heads, None))
    if v.shape[2] < 1:
        raise MLAInputError("v: got head dim 0, needs at least 1")
    if cu_seqlens_q.shape[0] < 1:
        raise MLAInputError("cu_seqlens_q: got an empty tensor, needs [batch + 1] entries")
    batch = cu_seqlens_q.shape[0] - 1
    check_shape("cu_seqlens_k", cu_seqlens_k, (batch + 1,))
    check_int("max_seqlen_q", max_seqlen_q, 0, INT32_MAX)
    softmax_scale = qk_dim ** -0.5 if softmax_scale is None else check_positive_float("softmax_scale", softmax_scale)
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise MLAInputError(f"{name}: got {flag!r}, needs a bool")
    q_quant, k_quant = check_format("q_quant", q_quant), check_format("k_quant", k_quant)
    p_quant, v_quant = check_format("p_quant", p_quant), check_format("v_quant", v_quant)
    q_amax = check_positive_float("q_amax", q_amax, allow_none=True)
    k_amax = check_positive_float("k_amax", k_amax, allow_none=True)
    p_amax = check_positive_float("p_amax", p_amax)
    v_amax = check_positive_float("v_amax", v_amax, allow_none=True)
    if isinstance(sparsity_m, bool) or not isinstance(sparsity_m, int) or sparsity_m not in (4, 8):
        raise MLAInputError(f"sparsity_m: got {sparsity_m!r}, needs 4 or 8")
    check_int("sparsity_n", sparsity_n, 0, sparsity_m)
    check_int("dense_sink_tokens", dense_sink_tokens, 0, INT32_MAX)
    check_int("dense_recent_tokens", dense_recent_tokens, 0, INT32_MAX)
    for name, tile in (("block_m", block_m), ("block_n", block_n)):
        if isinstance(tile, bool) or not isinstance(tile, int) or not 16 <= tile <= 256 or tile % 16:
            raise MLAInputError(f"{name}: got {tile!r}, needs an int multiple of 16 in 16..256")
    if content_checks_enabled(cu_seqlens_q):
        q_lens = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q, batch)
        _cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k, batch)
        if batch and int(q_lens.max()) > max_seqlen_q:
            raise MLAInputError(f"max_seqlen_q: got {max_seqlen_q}, needs at least the longest query sequence ({int(q_lens.max())})")
    features = set()
    if return_lse:
        features.add("lse")
    if sparsity_n and sparsity_n < sparsity_m:
        features.add("nm_sparsity")
    if kv_heads != heads:
        features.add("gqa")
    # a property of the inputs (backends may rank themselves by it), not a behaviour to support: a parameter,
    # present only when true so that ragged keys stay as they were
    dense = {"dense_batch": 1} if prefill_dense_batch(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q) else {}
    problem = Problem.make(
        "prefill", device.type, features, **dense,
        dtype=dtype_name(q.dtype), heads=heads, kv_heads=kv_heads, qk_dim=qk_dim, v_dim=v.shape[2],
        causal=int(causal), q_quant=q_quant, k_quant=k_quant, p_quant=p_quant, v_quant=v_quant,
        block_n=block_n, sparsity_m=sparsity_m if "nm_sparsity" in features else 0,
        batch=numerics.bucket_pow2(batch), max_seqlen_q=numerics.bucket_pow2(max_seqlen_q),
        total_k=numerics.bucket_pow2(total_k))
    call = PrefillCall(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse,
                       q_quant, k_quant, p_quant, v_quant, q_amax, k_amax, p_amax, v_amax, sparsity_n, sparsity_m,
                       dense_sink_tokens, dense_recent_tokens, block_m, block_n)
    return problem, call


# --------------------------------------------------------------------------------------------------
# merge


@dataclass
class MergeCall:
    """Validated arguments of :func:`mla_core.merge_attn_states`: outputs [tokens, heads, dim], lse [heads, tokens] fp32."""

    prefix_output: torch.Tensor
    prefix_lse: torch.Tensor
    suffix_output: torch.Tensor
    suffix_lse: torch.Tensor
    output: torch.Tensor | None
    output_lse: torch.Tensor | None


def validate_merge(prefix_output, prefix_lse, suffix_output, suffix_lse, output, output_lse) -> tuple[Problem, MergeCall]:
    check_tensor("prefix_output", prefix_output, 3, FLOAT_DTYPES)
    tokens, heads, dim = prefix_output.shape
    check_tensor("suffix_output", suffix_output, 3, (prefix_output.dtype,))
    check_shape("suffix_output", suffix_output, (tokens, heads, dim))
    check_tensor("prefix_lse", prefix_lse, 2, (torch.float32,))
    check_shape("prefix_lse", prefix_lse, (heads, tokens))
    check_tensor("suffix_lse", suffix_lse, 2, (torch.float32,))
    check_shape("suffix_lse", suffix_lse, (heads, tokens))
    if output is not None:
        check_tensor("output", output, 3, FLOAT_DTYPES)
        check_shape("output", output, (tokens, heads, dim))
    if output_lse is not None:
        check_tensor("output_lse", output_lse, 2, (torch.float32,))
        check_shape("output_lse", output_lse, (heads, tokens))
    device = check_same_device(prefix_output=prefix_output, prefix_lse=prefix_lse, suffix_output=suffix_output,
                               suffix_lse=suffix_lse, output=output, output_lse=output_lse)
    check_has_data("prefix_output", prefix_output)
    out_dtype = prefix_output.dtype if output is None else output.dtype
    problem = Problem.make("merge", device.type, dtype=dtype_name(prefix_output.dtype), out_dtype=dtype_name(out_dtype),
                           heads=heads, head_dim=dim, tokens=numerics.bucket_pow2(tokens))
    return problem, MergeCall(prefix_output, prefix_lse, suffix_output, suffix_lse, output, output_lse)


# --------------------------------------------------------------------------------------------------
# fused RoPE + FP8 quantization


@dataclass
class RopeQuantizeCall:
    """Validated arguments of :func:`mla_core.mla_rope_quantize_fp8`.

    q_rope [nnz, heads, rope]; k_rope [nnz, rope]; q_nope [nnz, heads, nope]; k_nope [nnz, nope];
    cos_sin_cache [max_pos, rope] (cos in [:rope/2], sin in [rope/2:]); pos_ids [nnz]; the four
    outputs are FP8 E4M3 tensors of the inputs' shapes (None: allocate).
    """

    q_rope: torch.Tensor
    k_rope: torch.Tensor
    q_nope: torch.Tensor
    k_nope: torch.Tensor
    cos_sin_cache: torch.Tensor
    pos_ids: torch.Tensor
    is_neox: bool
    quant_scale_q: float
    quant_scale_kv: float
    q_rope_out: torch.Tensor | None
    k_rope_out: torch.Tensor | None
    q_nope_out: torch.Tensor | None
    k_nope_out: torch.Tensor | None


def validate_rope_quantize(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
                           quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out,
                           k_nope_out) -> tuple[Problem, RopeQuantizeCall]:
    halfs = (torch.bfloat16, torch.float16)
    check_tensor("q_rope", q_rope, 3, halfs)
    nnz, heads, rope = q_rope.shape
    check_tensor("k_rope", k_rope, 2, (q_rope.dtype,))
    check_shape("k_rope", k_rope, (nnz, rope))
    check_tensor("q_nope", q_nope, 3, (q_rope.dtype,))
    check_shape("q_nope", q_nope, (nnz, heads, None))
    nope = q_nope.shape[2]
    check_tensor("k_nope", k_nope, 2, (q_rope.dtype,))
    check_shape("k_nope", k_nope, (nnz, nope))
    if rope < 2 or rope % 2:
        raise MLAInputError(f"q_rope: got rope width {rope}, needs an even width >= 2 (64 for DeepSeek)")
    check_tensor("cos_sin_cache", cos_sin_cache, 2, (torch.float32, torch.bfloat16))
    check_shape("cos_sin_cache", cos_sin_cache, (None, rope))
    check_contiguous("cos_sin_cache", cos_sin_cache)
    check_tensor("pos_ids", pos_ids, 1, INDEX_DTYPES)
    check_shape("pos_ids", pos_ids, (nnz,))
    if not isinstance(is_neox, bool):
        raise MLAInputError(f"is_neox: got {is_neox!r}, needs a bool")
    outs = {"q_rope_out": (q_rope_out, q_rope.shape), "k_rope_out": (k_rope_out, k_rope.shape),
            "q_nope_out": (q_nope_out, q_nope.shape), "k_nope_out": (k_nope_out, k_nope.shape)}
    # Buffers first: a bf16 buffer is reported by its own name, not as an inferred quantize_dtype.
    for name, (o, shape) in outs.items():
        if o is not None:
            check_tensor(name, o, len(shape), (FP8,))
            check_shape(name, o, tuple(shape))
    if quantize_dtype is None:
        quantize_dtype = next((o.dtype for o, _ in outs.values() if isinstance(o, torch.Tensor)), FP8)
    check_dtype_arg("quantize_dtype", quantize_dtype, (FP8,))
    quant_scale_q = check_positive_float("quant_scale_q", quant_scale_q)
    quant_scale_kv = check_positive_float("quant_scale_kv", quant_scale_kv)
    device = check_same_device(q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope, cos_sin_cache=cos_sin_cache,
                               pos_ids=pos_ids, **{n: o for n, (o, _) in outs.items()})
    if nnz and content_checks_enabled(pos_ids):
        p = pos_ids.to("cpu", torch.int64)
        lo, hi = int(p.min()), int(p.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise MLAInputError(f"pos_ids: got position {lo if lo < 0 else hi}, needs 0..{cos_sin_cache.shape[0] - 1} "
                                "(rows of cos_sin_cache)")
    problem = Problem.make("rope_quantize_fp8", device.type, dtype=dtype_name(q_rope.dtype),
                           cos_dtype=dtype_name(cos_sin_cache.dtype), heads=heads, rope_dim=rope, nope_dim=nope,
                           neox=int(is_neox), tokens=numerics.bucket_pow2(nnz))
    call = RopeQuantizeCall(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quant_scale_q,
                            quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out)
    return problem, call


# --------------------------------------------------------------------------------------------------
# FP8 top-k sparse decode

SPARSE_LATENT = 512
SPARSE_ROPE = 64
SPARSE_TOPK_MULTIPLE = 64
KV_LAYOUT_FP8 = "fp8"
"""MATE's 576-byte rows: 576 FP8 E4M3 values (512 latent + 64 RoPE), one per-tensor scale folded into bmm1/bmm2."""
KV_LAYOUT_DS_MLA = "fp8_ds_mla"
"""FlashMLA's / vLLM's 656-byte rows: 512 E4M3 values, 4 float32 scales (one per 128 values), 64 bf16 RoPE values."""
DS_MLA_ROW_BYTES = 656
DS_MLA_SCALE_BLOCK = 128


@dataclass(frozen=True)
class SparseDecodeMetadata:
    """Reusable schedule of :func:`mla_core.sparse_mla_fp8_decode` for one query shape, top-k and ``seq_lens``.

    ``valid_lens`` [batch] int32 (on the query's device) holds ``min(seq_lens, top_k)``, computed on the
    device (no host sync). ``from_seq_lens`` records whether it was built from a ``seq_lens`` tensor (False:
    every slot valid). Prepare a new object whenever seq_lens values, the query shape or top-k change: a
    call refuses metadata built for another shape, top-k or q_len (always) or for other ``seq_lens`` values
    (when content checks are on).
    """

    batch: int
    q_len: int
    heads: int
    top_k: int
    valid_lens: torch.Tensor
    from_seq_lens: bool = True


def make_sparse_metadata(query: torch.Tensor, seq_lens: torch.Tensor | None, top_k: int) -> SparseDecodeMetadata:
    batch, q_len, heads = query.shape[0], query.shape[1], query.shape[2]
    if seq_lens is None:
        valid = torch.full((batch,), top_k, dtype=torch.int32, device=query.device)
    else:
        valid = seq_lens.to(torch.int32).clamp(0, top_k)
    return SparseDecodeMetadata(batch, q_len, heads, top_k, valid, seq_lens is not None)


@dataclass
class SparseDecodeCall:
    """Validated arguments of :func:`mla_core.sparse_mla_fp8_decode`.

    ``kv_layout`` :data:`KV_LAYOUT_FP8`: query [batch, q_len, heads, 576] FP8, kv_cache [rows, 576] FP8;
    :data:`KV_LAYOUT_DS_MLA`: query [batch, q_len, heads, 576] bf16, kv_cache [rows, 656] uint8 (a flat
    view of the cache: indices are physical token rows). indices [batch, q_len, top_k] int32 (-1 = none);
    ``metadata`` holds the valid length per request; scores are ``q·k * bmm1_scale``, the output
    ``softmax · V * bmm2_scale`` with V the first 512 values; out [batch, q_len, heads, 512] bf16,
    lse [batch, q_len, heads] fp32 (natural log).
    """

    query: torch.Tensor
    kv_cache: torch.Tensor
    indices: torch.Tensor
    metadata: SparseDecodeMetadata
    bmm1_scale: float
    bmm2_scale: float
    out: torch.Tensor | None
    lse: torch.Tensor | None
    return_lse: bool
    kv_layout: str = KV_LAYOUT_FP8


def sparse_kv_layout(kv_cache: Any) -> str:
    """Which cache layout ``kv_cache`` holds, from its last dimension: 576 -> MATE's FP8 rows, 656 -> fp8_ds_mla."""
    check_tensor("kv_cache", kv_cache, (3, 4))
    width = kv_cache.shape[-1]
    if width == SPARSE_LATENT + SPARSE_ROPE:
        check_tensor("kv_cache", kv_cache, (3, 4), (FP8,))
        return KV_LAYOUT_FP8
    if width == DS_MLA_ROW_BYTES:
        check_tensor("kv_cache", kv_cache, (3, 4), (torch.uint8, FP8))
        return KV_LAYOUT_DS_MLA
    raise MLAInputError(f"kv_cache: got last dimension {width}, needs {SPARSE_LATENT + SPARSE_ROPE} (FP8 E4M3 rows) "
                        f"or {DS_MLA_ROW_BYTES} (fp8_ds_mla rows, uint8)")


def _sparse_query_dtype(layout: str) -> torch.dtype:
    return FP8 if layout == KV_LAYOUT_FP8 else torch.bfloat16


def check_top_k(top_k: Any) -> int:
    """``sparse_mla_top_k`` is a positive int multiple of 64."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0 or top_k % SPARSE_TOPK_MULTIPLE:
        raise MLAInputError(f"sparse_mla_top_k: got {top_k!r}, needs a positive multiple of {SPARSE_TOPK_MULTIPLE}")
    return top_k


def _check_sparse_lens(seq_lens: torch.Tensor, top_k: int) -> torch.Tensor:
    """Content check: every sparse length is in 0..top_k; returns them as a CPU int64 tensor."""
    s = seq_lens.to("cpu", torch.int64)
    if s.numel() and (int(s.min()) < 0 or int(s.max()) > top_k):
        bad = int(s.min()) if int(s.min()) < 0 else int(s.max())
        raise MLAInputError(f"seq_lens: got {bad}, needs 0..{top_k} (sparse_mla_top_k)")
    return s


def validate_sparse_metadata(query: Any, seq_lens: Any, top_k: Any) -> SparseDecodeMetadata:
    """Validate :func:`mla_core.get_sparse_decode_metadata`'s arguments and build the metadata.

    ``query`` is FP8 (576-byte cache rows) or bf16 (fp8_ds_mla rows); only its shape and device are used.
    """
    check_tensor("query", query, 4, (FP8, torch.bfloat16))
    check_shape("query", query, (None, None, None, SPARSE_LATENT + SPARSE_ROPE))
    check_top_k(top_k)
    if seq_lens is not None:
        check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
        check_shape("seq_lens", seq_lens, (query.shape[0],))
        check_same_device(query=query, seq_lens=seq_lens)
        if content_checks_enabled(seq_lens):
            _check_sparse_lens(seq_lens, top_k)
    return make_sparse_metadata(query, seq_lens, top_k)


def _check_metadata(metadata: Any, query: torch.Tensor, seq_lens: torch.Tensor | None, top_k: int,
                    device: torch.device, by_value: bool) -> None:
    """Refuse metadata built for another call: shape, q_len, heads, top-k and whether seq_lens was given
    (always, from metadata), and the valid lengths themselves when ``by_value`` (content checks on)."""
    if not isinstance(metadata, SparseDecodeMetadata):
        raise MLAInputError(f"metadata: got {type(metadata).__name__}, needs the object get_sparse_decode_metadata() "
                            "returns")
    batch, q_len, heads = query.shape[:3]
    vl = metadata.valid_lens
    if not isinstance(vl, torch.Tensor) or vl.dtype != torch.int32 or tuple(vl.shape) != (batch,):
        got_vl = f"{vl.dtype} {list(vl.shape)}" if isinstance(vl, torch.Tensor) else type(vl).__name__
        raise MLAInputError(f"metadata: got valid_lens {got_vl}, needs int32 [{batch}] (build it with "
                            "get_sparse_decode_metadata())")
    want = (batch, q_len, heads, top_k, seq_lens is not None)
    got = (metadata.batch, metadata.q_len, metadata.heads, metadata.top_k, metadata.from_seq_lens)
    if got != want or metadata.valid_lens.device != device:
        raise MLAInputError(f"metadata: got metadata prepared for (batch, q_len, heads, top_k, seq_lens given) = {got} "
                            f"on {metadata.valid_lens.device}, needs {want} on {device}; call "
                            "get_sparse_decode_metadata() again")
    if by_value and seq_lens is not None:
        now = seq_lens.to("cpu", torch.int64).clamp(0, top_k)
        built = metadata.valid_lens.to("cpu", torch.int64)
        if not torch.equal(now, built):
            b = int((now != built).nonzero()[0, 0])
            raise MLAInputError(f"metadata: got metadata prepared for seq_lens[{b}] = {int(built[b])}, needs "
                                f"{int(now[b])} (this call's seq_lens); call get_sparse_decode_metadata() again "
                                "whenever seq_lens change")


def _host_scalar(name: str, v: Any) -> float:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or v.device.type != "cpu":
            raise MLAInputError(f"{name}: got a tensor of shape {list(v.shape)} on {v.device}, needs a host scalar")
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise MLAInputError(f"{name}: got {v!r}, needs a finite float")
    if v != 0 and not FLOAT32_MIN_NORMAL <= abs(float(v)) <= FLOAT32_MAX:  # kernels hold it in float32
        raise MLAInputError(f"{name}: got {v!r}, needs 0 or a magnitude in float32's normal range "
                            f"({FLOAT32_MIN_NORMAL:.3g}..{FLOAT32_MAX:.3g})")
    return float(v)


def validate_sparse_decode(query, kv_cache, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
                           sparse_mla_top_k, out, bmm1_scale, bmm2_scale, lse, return_lse, metadata, *,
                           check_indices: bool = True) -> tuple[Problem, SparseDecodeCall]:
    """Validate :func:`mla_core.sparse_mla_fp8_decode`'s arguments.

    The cache layout comes from ``kv_cache``'s last dimension (:func:`sparse_kv_layout`): 576 FP8 values
    with an FP8 query, or 656-byte fp8_ds_mla rows (uint8, or FP8 as FlashMLA types them) with a bf16 query.
    ``check_indices=False`` (the FlashInfer/MATE-compatible surface) leaves index slots outside the cache to
    the kernels, which skip them, instead of raising in the content checks.
    """
    layout = sparse_kv_layout(kv_cache)
    q_dtype = _sparse_query_dtype(layout)
    check_tensor("query", query, 4)
    if query.dtype != q_dtype:
        raise MLAInputError(f"query: got dtype {dtype_name(query.dtype)}, needs {dtype_name(q_dtype)} with a "
                            f"{kv_cache.shape[-1]}-wide kv_cache ({layout} rows)")
    batch, q_len, heads, dim = query.shape
    if kv_lora_rank != SPARSE_LATENT:
        raise MLAInputError(f"kv_lora_rank: got {kv_lora_rank!r}, needs {SPARSE_LATENT}")
    if qk_rope_head_dim != SPARSE_ROPE:
        raise MLAInputError(f"qk_rope_head_dim: got {qk_rope_head_dim!r}, needs {SPARSE_ROPE}")
    full = SPARSE_LATENT + SPARSE_ROPE
    row_width = kv_cache.shape[-1]
    check_shape("query", query, (None, None, None, full))
    check_contiguous("query", query)
    if kv_cache.dim() == 4:
        check_shape("kv_cache", kv_cache, (None, 1, None, row_width))
    check_contiguous("kv_cache", kv_cache)
    rows = kv_cache.numel() // row_width
    check_top_k(sparse_mla_top_k)
    check_tensor("block_tables", block_tables, 3, (torch.int32,))
    check_shape("block_tables", block_tables, (batch, q_len, sparse_mla_top_k))
    check_contiguous("block_tables", block_tables)
    if seq_lens is not None:
        check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
        check_shape("seq_lens", seq_lens, (batch,))
    if out is not None:
        check_tensor("out", out, 4, (torch.bfloat16,))
        check_shape("out", out, (batch, q_len, heads, SPARSE_LATENT))
        check_contiguous("out", out)
    if lse is not None:
        check_tensor("lse", lse, (2, 3), (torch.float32,))
        if tuple(lse.shape) not in ((batch * q_len, heads), (batch, q_len, heads)):
            raise MLAInputError(f"lse: got shape {list(lse.shape)}, needs [batch * q_len, heads] = "
                                f"{[batch * q_len, heads]} or [batch, q_len, heads] = {[batch, q_len, heads]}")
        check_contiguous("lse", lse)
    b1, b2 = _host_scalar("bmm1_scale", bmm1_scale), _host_scalar("bmm2_scale", bmm2_scale)
    if not isinstance(return_lse, bool):
        raise MLAInputError(f"return_lse: got {return_lse!r}, needs a bool")
    device = check_same_device(query=query, kv_cache=kv_cache, block_tables=block_tables, seq_lens=seq_lens,
                               out=out, lse=lse)
    by_value = content_checks_enabled(query)
    if metadata is not None:
        _check_metadata(metadata, query, seq_lens, sparse_mla_top_k, device, by_value)
    if by_value:
        if seq_lens is not None:
            s = _check_sparse_lens(seq_lens, sparse_mla_top_k)
        else:
            s = torch.full((batch,), sparse_mla_top_k, dtype=torch.int64, device="cpu")
        if check_indices:
            idx = block_tables.to("cpu", torch.int64)
            valid = torch.arange(sparse_mla_top_k, device="cpu")[None, None, :] < s[:, None, None]
            used = idx[valid & (idx != -1)]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= rows):
                bad = int(used.min()) if int(used.min()) < 0 else int(used.max())
                raise MLAInputError(f"block_tables: got token index {bad}, needs -1 or 0..{rows - 1} (kv_cache rows)")
    if metadata is None:
        metadata = make_sparse_metadata(query, seq_lens, sparse_mla_top_k)
    features = {"lse"} if (return_lse or lse is not None) else set()
    problem = Problem.make("sparse_decode", device.type, features, heads=heads, q_len=q_len, top_k=sparse_mla_top_k,
                           kv_lora_rank=SPARSE_LATENT, rope_dim=SPARSE_ROPE, kv_layout=layout,
                           batch=numerics.bucket_pow2(batch))
    flat = kv_cache.view(torch.uint8) if layout == KV_LAYOUT_DS_MLA else kv_cache
    call = SparseDecodeCall(query, flat.view(rows, row_width), block_tables, metadata, b1, b2, out, lse, return_lse,
                            layout)
    return problem, call
