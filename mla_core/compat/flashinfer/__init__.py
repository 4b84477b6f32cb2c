"""FlashInfer's MLA entry points with FlashInfer's names, signatures and defaults, run by mla_core.

An engine written against ``flashinfer.rope`` / ``flashinfer.decode`` (or ``flashinfer.mla``) swaps one import::

    from mla_core.compat.flashinfer import decode, rope   # instead of: from flashinfer import decode, rope

``rope.mla_rope_quantize_fp8`` and ``decode.trtllm_batch_decode_with_kv_cache_mla`` (the FP8 sparse path,
``sparse_mla_top_k > 0``) behave as MATE's FlashInfer wrapper does, in every ``MLA_CORE_CHECKS`` mode: an
index past the cache among the valid slots is skipped (the key is absent), not an error, and a query row
with no valid key gets LSE **+inf** (FlashMLA's / FlashInfer's convention, which vLLM's merge reads as
"empty"); mla_core's native ``sparse_mla_fp8_decode`` keeps LSE -inf (docs/sparse.md). With
``sparse_mla_top_k = 0`` the same function is FlashInfer's dense decode over a bf16 or FP8 cache (one query
token per request), run by ``mla_core.mla_decode``.
"""
from . import decode, mla, rope

__all__ = ["decode", "mla", "rope"]
