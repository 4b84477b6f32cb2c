"""DeepSeek-V3 attention as a ``torch.nn.Module`` on mla_core's fused layer (:func:`mla_core.mla_forward`).

:class:`MLAAttention` has the submodules and parameter names of Hugging Face transformers' ``DeepseekV3Attention``
(``q_a_proj``, ``q_a_layernorm``, ``q_b_proj`` or ``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
``kv_b_proj``, ``o_proj``), so ``load_state_dict`` takes a checkpoint's attention weights unchanged: bf16 / fp32,
or FP8 E4M3 with ``weight_scale_inv`` block scales when the config carries an FP8 ``quantization_config``. It owns
one layer's paged latent cache; the caller owns the block table and the per-request cached lengths, shared by
every layer (:class:`StaticPageTable` is a simple one). With ``tp_group`` the heads are sharded over the ranks
of a ``torch.distributed`` group (docs/layer.md, "Tensor parallelism").
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .decode_graphs import DEFAULT_MAX_GRAPHS, DecodeGraphs
from .layer import checked_call, dequantize_weight, mla_forward

FP8 = torch.float8_e4m3fn
DEFAULT_NORM_EPS = 1e-6
"""Epsilon of the q / kv latent RMSNorms (DeepSeek-V3 and transformers build them with the default 1e-6)."""


# --------------------------------------------------------------------------------------------------
# configuration


def rope_parameters(config: Any) -> dict[str, Any]:
    """RoPE settings of a DeepSeek-V3 config: transformers >= 5 ``rope_parameters``, or ``rope_scaling`` + ``rope_theta``."""
    params = getattr(config, "rope_parameters", None)
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(config: Any) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rope / 2] float32 and the cos/sin magnitude (YaRN's attention factor, else 1).

    ``rope_type`` "default" is plain RoPE; "yarn" blends interpolated (``/ factor``) and extrapolated frequencies
    with a linear ramp between the correction dimensions of ``beta_fast`` / ``beta_slow`` rotations over
    ``original_max_position_embeddings`` (floored / ceiled unless ``truncate`` is False), as DeepSeek-V3 does.
    """
    params = rope_parameters(config)
    dim = config.qk_rope_head_dim
    base = float(params["rope_theta"])
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    if params["rope_type"] == "default":
        return 1.0 / (base ** exponents), 1.0
    if params["rope_type"] != "yarn":
        raise ValueError(f"rope_type {params['rope_type']!r} is not supported (default, yarn)")
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or config.max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** exponents
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def softmax_scale(config: Any) -> float:
    """``(qk_nope + qk_rope) ** -0.5``, times ``yarn_mscale(factor, mscale_all_dim) ** 2`` under YaRN (DeepSeek-V3)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    if params["rope_type"] != "default" and params.get("mscale_all_dim"):
        m = _yarn_mscale(params["factor"], params["mscale_all_dim"])
        scale = scale * m * m
    return scale


def freqs_cis_table(config: Any, positions: int | None = None) -> torch.Tensor:
    """[positions, rope] float32 rows ``(cos_0, sin_0, cos_1, sin_1, ...)`` times the attention factor.

    Angles are ``float32(pos) * inv_freq`` in float32, as transformers computes them. ``positions`` defaults to
    ``config.max_position_embeddings``.
    """
    inv_freq, magnitude = rope_inv_freq(config)
    positions = config.max_position_embeddings if positions is None else positions
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.stack((angles.cos() * magnitude, angles.sin() * magnitude), dim=-1).flatten(1)


def fp8_block_size(config: Any) -> tuple[int, int] | None:
    """The FP8 weight block of a config's ``quantization_config`` (``quant_method`` "fp8"), or None (float weights)."""
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    if qc.get("quant_method") != "fp8":
        raise ValueError(f"quantization_config: quant_method {qc.get('quant_method')!r} is not supported (fp8)")
    block = qc.get("weight_block_size") or (128, 128)
    return int(block[0]), int(block[1])


# --------------------------------------------------------------------------------------------------
# building blocks


def _identity(t: torch.Tensor | None) -> tuple:
    """What says a tensor is unchanged: its object, storage address and version counter (None: empty)."""
    if t is None:
        return ()
    try:
        version = t._version
    except RuntimeError:             # an inference tensor has no version counter
        version = -1
    return id(t), t.data_ptr(), version


class RMSNorm(nn.Module):
    """transformers' DeepseekV3RMSNorm: normalize in float32, cast back, multiply by ``weight``."""

    def __init__(self, size: int, eps: float = DEFAULT_NORM_EPS, dtype=None, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps): torch computes a bf16 / fp16 x in float32 and rounds once to x's dtype
        # (the same values as x.float() -> rms_norm -> .to(x.dtype); on a GPU one kernel instead of three)
        return self._parameters["weight"] * F.rms_norm(x, (x.shape[-1],), eps=self.eps)   # (no __getattr__)


class BlockFP8Linear(nn.Module):
    """A linear layer with FP8 E4M3 weight [out, in] and float32 ``weight_scale_inv`` [ceil(out/b0), ceil(in/b1)].

    The weight's value is code x block scale (a DeepSeek-V3 FP8 checkpoint's convention); the product runs in
    float32 on the dequantized weight and is rounded to the input's dtype.
    """

    def __init__(self, in_features: int, out_features: int, block: tuple[int, int], bias: bool = False,
                 dtype=None, device=None):
        super().__init__()
        self.in_features, self.out_features, self.block = in_features, out_features, block
        self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=FP8, device=device),
                                   requires_grad=False)
        self.weight_scale_inv = nn.Parameter(
            torch.ones(-(-out_features // block[0]), -(-in_features // block[1]), device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    def dequantized(self) -> torch.Tensor:
        """The weight's float32 value [out, in]."""
        return dequantize_weight(self.weight, self.weight_scale_inv, self.block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.float(), self.dequantized(), None if self.bias is None else self.bias.float())
        return y.to(x.dtype)


def _linear(in_features: int, out_features: int, block, bias: bool, dtype, device) -> nn.Module:
    if block is None:
        return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)
    return BlockFP8Linear(in_features, out_features, block, bias=bias, dtype=dtype, device=device)


class StaticPageTable:
    """A fixed page assignment for ``batch`` requests of up to ``max_len`` tokens, and their cached lengths.

    ``block_table`` [batch, pages_per_request] int32 hands each request its own pages (in a random order when a
    generator is given, as a real allocator's pages come); ``lengths`` [batch] int64 counts cached tokens and
    is what :class:`MLAAttention` takes as ``cache_lengths``; call :meth:`advance` after every layer ran a step.
    """

    def __init__(self, batch: int, max_len: int, page_size: int, device=None, generator: torch.Generator | None = None):
        self.page_size = page_size
        pages_per_request = max(1, -(-max_len // page_size))
        self.num_pages = batch * pages_per_request
        order = (torch.randperm(self.num_pages, generator=generator, device="cpu") if generator is not None
                 else torch.arange(self.num_pages, device="cpu"))
        self.block_table = order.view(batch, pages_per_request).to(device=device, dtype=torch.int32)
        self.lengths = torch.zeros(batch, dtype=torch.int64, device=device)

    def advance(self, new_tokens: torch.Tensor) -> None:
        """Count ``new_tokens`` [batch] more cached tokens per request."""
        self.lengths += new_tokens.to(self.lengths.device, torch.int64)


# --------------------------------------------------------------------------------------------------
# the module


class MLAAttention(nn.Module):
    """DeepSeek-V3 multi-head latent attention on a paged latent cache (transformers' weight names).

    Args:
        config: a transformers ``DeepseekV3Config`` (or any object with its attributes: hidden_size,
            num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
            max_position_embeddings, rope_parameters / rope_scaling, attention_bias, rope_interleave,
            quantization_config).
        num_pages, page_size: the latent cache [num_pages, page_size, kv_lora_rank + qk_rope_head_dim] this
            layer owns (:meth:`reset_cache` reallocates it).
        dtype, device: of the parameters and the cache (FP8 weights keep FP8 E4M3 and float32 scales).
        tp_group: a ``torch.distributed`` process group to shard the heads over (None: all heads here).
        attention_backend: backend name for the inner attention (None: automatic dispatch).
        cuda_graph_decode: replay each CUDA decode step (one token per request, ``max_seq_len=1``, grad off) as a
            CUDA graph per key, after one eager call of that key (docs/layer.md); every other call runs eagerly.
        max_decode_graphs: keys (graphs) kept with ``cuda_graph_decode``, least recently used evicted.

    ``forward(hidden_states [tokens, hidden], input_row_offsets [batch + 1], block_table [batch, max_pages],
    cache_lengths [batch], max_seq_len=None) -> [tokens, hidden]`` writes the tokens' latent rows into the cache
    at positions ``cache_lengths[b] + i`` and attends causally over each request's cache (prefill when a request
    has more than one token, absorbed decode otherwise). It does not advance ``cache_lengths``.
    """

    def __init__(self, config: Any, *, num_pages: int = 0, page_size: int = 64, dtype: torch.dtype | None = None,
                 device=None, tp_group=None, attention_backend: str | None = None, cuda_graph_decode: bool = False,
                 max_decode_graphs: int = DEFAULT_MAX_GRAPHS):
        super().__init__()
        if cuda_graph_decode is not False and cuda_graph_decode is not True:
            raise ValueError(f"cuda_graph_decode: got {cuda_graph_decode!r}, needs a bool")
        if cuda_graph_decode:
            self.__dict__["_decode_graphs"] = DecodeGraphs(max_decode_graphs)
        dtype = dtype or torch.get_default_dtype()
        self.tp_group = tp_group
        self.tp_size, self.tp_rank = 1, 0
        if tp_group is not None:
            import torch.distributed as dist
            self.tp_size, self.tp_rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        if self.num_heads % self.tp_size:
            raise ValueError(f"num_attention_heads {self.num_heads} is not divisible by the {self.tp_size} ranks")
        self.local_heads = self.num_heads // self.tp_size
        self.q_lora_rank = config.q_lora_rank
        self.kv_lora_rank = config.kv_lora_rank
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim = config.v_head_dim
        self.qk_dim = self.nope_dim + self.rope_dim
        self.rope_interleave = bool(getattr(config, "rope_interleave", True))
        self.softmax_scale = softmax_scale(config)
        self.attention_backend = attention_backend
        self.block = fp8_block_size(config)
        bias = bool(getattr(config, "attention_bias", False))
        if self.block is not None:
            self._check_fp8_shards()
        heads = self.local_heads

        def linear(i, o, b=False):
            return _linear(i, o, self.block, b, dtype, device)

        if self.q_lora_rank is None:
            self.q_proj = linear(self.hidden_size, heads * self.qk_dim)
        else:
            self.q_a_proj = linear(self.hidden_size, self.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, dtype=dtype, device=device)
            self.q_b_proj = linear(self.q_lora_rank, heads * self.qk_dim)
        self.kv_a_proj_with_mqa = linear(self.hidden_size, self.kv_lora_rank + self.rope_dim, bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, dtype=dtype, device=device)
        self.kv_b_proj = linear(self.kv_lora_rank, heads * (self.nope_dim + self.v_dim))
        self.o_proj = linear(heads * self.v_dim, self.hidden_size, bias)   # row-parallel: bias after the all-reduce
        self.register_buffer("freqs_cis", freqs_cis_table(config).to(device), persistent=False)
        self.register_buffer("latent_cache", torch.empty(0), persistent=False)
        self.reset_cache(num_pages, page_size, dtype=dtype, device=device)
        if self.tp_size > 1:
            from . import autotune
            autotune.sync(tp_group)          # every rank runs the kernels rank 0 chose

    def _check_fp8_shards(self) -> None:
        b_out, b_in = self.block
        if self.nope_dim % b_out or self.v_dim % b_out:
            raise ValueError(f"FP8 kv_b_proj with block {self.block}: qk_nope_head_dim {self.nope_dim} and v_head_dim "
                             f"{self.v_dim} must be multiples of {b_out} to split its scales into w_k / w_uk / w_uv")
        if self.tp_size > 1 and ((self.local_heads * self.qk_dim) % b_out or (self.local_heads * self.v_dim) % b_in):
            raise ValueError(f"FP8 weights with block {self.block} cannot be sharded over {self.tp_size} ranks: "
                             "each rank's q_b_proj rows and o_proj columns must be whole blocks")

    def reset_cache(self, num_pages: int, page_size: int, dtype: torch.dtype | None = None, device=None) -> None:
        """Allocate a fresh latent cache [num_pages, page_size, kv_lora_rank + qk_rope_head_dim] (contents undefined)."""
        dtype = dtype or self.kv_a_layernorm.weight.dtype
        device = device or self.kv_a_layernorm.weight.device
        self.latent_cache = torch.empty(num_pages, page_size, self.kv_lora_rank + self.rope_dim, dtype=dtype,
                                        device=device)

    # ---- checkpoints: full (unsharded) transformers weights, sliced to this rank's heads

    def _shard_rows(self, t: torch.Tensor, per_head: int, rows_per_block: int) -> torch.Tensor:
        rows = self.local_heads * per_head // rows_per_block
        return t.narrow(0, self.tp_rank * rows, rows)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if self.tp_size > 1:
            b_out, b_in = self.block or (1, 1)
            shards = {"q_proj": self.qk_dim, "q_b_proj": self.qk_dim, "kv_b_proj": self.nope_dim + self.v_dim}
            for name, per_head in shards.items():
                for leaf, unit in (("weight", 1), ("weight_scale_inv", b_out)):
                    key = f"{prefix}{name}.{leaf}"
                    full_rows = self.num_heads * per_head // unit
                    if key in state_dict and state_dict[key].shape[0] == full_rows:
                        state_dict[key] = self._shard_rows(state_dict[key], per_head, unit)
            for leaf, unit in (("weight", 1), ("weight_scale_inv", b_in)):
                key = f"{prefix}o_proj.{leaf}"
                cols = self.local_heads * self.v_dim // unit
                if key in state_dict and state_dict[key].shape[1] == self.num_heads * self.v_dim // unit:
                    state_dict[key] = state_dict[key].narrow(1, self.tp_rank * cols, cols)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ---- the layer's weights as mla_forward takes them

    def layer_weights(self) -> dict[str, Any]:
        """``w_k`` [H*nope, latent], ``w_uk`` [H, latent, nope], ``w_uv`` [H, v, latent] (+ FP8 scales) from kv_b_proj.

        Built once and kept while ``kv_b_proj``'s weight (and scales) stay the same tensors with the same version
        and storage (an in-place update, a reload or a move rebuilds them): the same tensor objects every step,
        so a layer backend's per-weight caches hit. Costs one copy of w_uk (the transposed FP8 codes or bf16 values).
        """
        if torch.compiler.is_compiling():            # traced: views of the parameters, no Python-side cache
            return self._build_layer_weights()
        params = self._modules["kv_b_proj"]._parameters     # (a missing attribute would cost an exception)
        key = (_identity(params["weight"]), _identity(params.get("weight_scale_inv")))
        cached = self.__dict__.get("_layer_weights")
        if cached is None or cached[0] != key:
            cached = (key, self._build_layer_weights())
            self.__dict__["_layer_weights"] = cached
        return cached[1]

    def _build_layer_weights(self) -> dict[str, Any]:
        heads, nope, v, latent = self.local_heads, self.nope_dim, self.v_dim, self.kv_lora_rank
        w = self.kv_b_proj.weight.view(heads, nope + v, latent)
        out = dict(w_k=w[:, :nope].reshape(heads * nope, latent), w_uk=w[:, :nope].transpose(1, 2).contiguous(),
                   w_uv=w[:, nope:].contiguous())
        if self.block is not None:
            b_out = self.block[0]
            s = self.kv_b_proj.weight_scale_inv.view(heads, (nope + v) // b_out, -1)
            out.update(w_k_scale=s[:, :nope // b_out].reshape(heads * nope // b_out, -1),
                       w_uk_scale=s[:, :nope // b_out].transpose(1, 2).contiguous(),
                       w_uv_scale=s[:, nope // b_out:].contiguous(), weight_block_size=self.block)
        return out

    def forward(self, hidden_states: torch.Tensor, input_row_offsets: torch.Tensor, block_table: torch.Tensor,
                cache_lengths: torch.Tensor, max_seq_len: int | None = None, sparse_indices: torch.Tensor | None = None,
                topk_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Attention output [tokens, hidden] of ``hidden_states`` [tokens, hidden] (see the class docstring).

        ``max_seq_len``: the longest request's token count in this call (None: read from ``input_row_offsets``,
        a host sync); 1 runs the absorbed decode. ``sparse_indices`` [tokens, top_k] / ``topk_lengths`` [tokens]:
        DeepSeek-V3.2's selected cache rows per token (see :func:`mla_core.mla_forward`). With
        ``cuda_graph_decode`` a CUDA decode step replays a CUDA graph (docs/layer.md).
        """
        graphs = self.__dict__.get("_decode_graphs")
        if graphs is not None and sparse_indices is None and topk_lengths is None:
            key = graphs.key(self, hidden_states, input_row_offsets, block_table, cache_lengths, max_seq_len)
            if key is not None:
                out = graphs.run(self, key, hidden_states, input_row_offsets, block_table, cache_lengths)
                if out is None:              # a new key: this call runs eagerly, its next one captures
                    out = self._step(hidden_states, input_row_offsets, block_table, cache_lengths, max_seq_len)
                    graphs.seen(key)
                return out
        return self._step(hidden_states, input_row_offsets, block_table, cache_lengths, max_seq_len, sparse_indices,
                          topk_lengths)

    def _layer_args(self, q: torch.Tensor, kv: torch.Tensor, input_row_offsets, block_table, cache_lengths,
                    max_seq_len: int, sparse_indices=None, topk_lengths=None) -> tuple[tuple, dict[str, Any]]:
        """mla_forward's positional and keyword arguments for q [tokens, heads, qk] and kv [tokens, latent + rope]."""
        norm = self._modules["kv_a_layernorm"]
        buffers = self._buffers
        return ((q, kv, input_row_offsets, buffers["freqs_cis"], norm._parameters["weight"], buffers["latent_cache"],
                 block_table, cache_lengths),
                dict(max_seq_len=max_seq_len, softmax_scale=self.softmax_scale, epsilon=norm.eps,
                     rope_interleave=self.rope_interleave, attention_backend=self.attention_backend,
                     sparse_indices=sparse_indices, topk_lengths=topk_lengths, **self.layer_weights()))

    def _check_decode(self, q: torch.Tensor, kv: torch.Tensor, input_row_offsets, block_table, cache_lengths) -> None:
        """The checks the decode step's mla_forward runs (current MLA_CORE_CHECKS mode) on the caller's index
        tensors, with q / kv stand-ins of the step's shapes: raises MLAInputError, launches nothing."""
        args, kwargs = self._layer_args(q, kv, input_row_offsets, block_table, cache_lengths, 1)
        checked_call(*args, **kwargs)

    def _step(self, hidden_states: torch.Tensor, input_row_offsets: torch.Tensor, block_table: torch.Tensor,
              cache_lengths: torch.Tensor, max_seq_len: int | None = None, sparse_indices: torch.Tensor | None = None,
              topk_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The eager step (what forward runs without a graph)."""
        tokens = hidden_states.shape[0]
        if max_seq_len is None:
            lens = input_row_offsets[1:] - input_row_offsets[:-1]
            max_seq_len = int(lens.max()) if lens.numel() else 0
        mods = self._modules      # (what self.<name> finds, without Module.__getattr__)
        if self.q_lora_rank is None:
            q = mods["q_proj"](hidden_states)
        else:
            q = mods["q_b_proj"](mods["q_a_layernorm"](mods["q_a_proj"](hidden_states)))
        kv = mods["kv_a_proj_with_mqa"](hidden_states)
        args, kwargs = self._layer_args(q.view(tokens, self.local_heads, self.qk_dim), kv, input_row_offsets,
                                        block_table, cache_lengths, max_seq_len, sparse_indices, topk_lengths)
        attn = mla_forward(*args, **kwargs)
        attn = attn.reshape(tokens, self.local_heads * self.v_dim)
        if self.tp_size == 1:
            return mods["o_proj"](attn)
        import torch.distributed as dist
        if isinstance(self.o_proj, BlockFP8Linear):
            out = F.linear(attn.float(), self.o_proj.dequantized()).to(attn.dtype)
        else:
            out = F.linear(attn, self.o_proj.weight)
        dist.all_reduce(out, group=self.tp_group)          # the partial sums of each rank's heads
        return out if self.o_proj.bias is None else out + self.o_proj.bias
