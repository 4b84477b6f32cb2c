"""mla_core: one API for DeepSeek-style Multi-head Latent Attention kernels.

Public ops (each takes a keyword-only ``backend=``): :func:`mla_decode` / :func:`mla_attention_decode`,
:func:`mla_prefill` / :func:`mla_prefill_attention`, :func:`merge_attn_states`,
:func:`mla_rope_quantize_fp8`, :func:`sparse_mla_fp8_decode`, :func:`get_sparse_decode_metadata`,
:func:`mla_forward` (the fused layer); :mod:`mla_core.nn` holds the DeepSeek-V3 attention module.
Backends are pluggy plugins (entry-point group ``mla_core``) subclassing :class:`Backend`.
"""
from importlib.metadata import PackageNotFoundError, version as _version

from . import numerics, torch_ops  # torch_ops registers torch.ops.mla_core.* for torch.compile
from . import autotune  # registers the cache and tuner as dispatch's choice sources
from .backend import Backend, BackendOutputError, OpCapability
from .dispatch import use_backend
from .errors import MLAInputError, NoBackendError
from .explain import explain  # the function; its module stays importable as mla_core.explain
from . import nn
from .layer import mla_forward
from .ops import (get_batch_decode_metadata_mla, get_sparse_decode_metadata, merge_attn_states, mla_attention_decode,
                  mla_decode, mla_prefill, mla_prefill_attention, mla_rope_quantize_fp8, sparse_mla_fp8_decode)
from .plugins import backends, get_backend, hookimpl, hookspec, register_plugin
from .problem import Problem
from .specs import SparseDecodeMetadata

try:
    __version__ = _version("mla-core")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "Backend", "BackendOutputError", "MLAInputError", "NoBackendError", "OpCapability", "Problem", "SparseDecodeMetadata", "backends",
    "get_backend", "get_batch_decode_metadata_mla", "get_sparse_decode_metadata", "hookimpl", "hookspec",
    "merge_attn_states", "mla_attention_decode", "mla_decode", "mla_prefill", "mla_prefill_attention",
    "mla_forward", "mla_rope_quantize_fp8", "nn", "numerics", "register_plugin", "sparse_mla_fp8_decode", "use_backend",
]
