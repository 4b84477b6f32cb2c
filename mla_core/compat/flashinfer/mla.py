"""``flashinfer.mla``, where newer FlashInfer releases define the function ``flashinfer.decode`` re-exports."""
from .decode import trtllm_batch_decode_with_kv_cache_mla

__all__ = ["trtllm_batch_decode_with_kv_cache_mla"]
