"""The reference backend object: every op, every format, any device, slow and exact."""
from __future__ import annotations

import mla_core
from mla_core import OpCapability

from . import decode, layer, merge, prefill, rope, sparse

_ALL_FORMATS = frozenset({None, "fp8", "nvfp4"})


class ReferenceBackend(mla_core.Backend):
    name = "reference"
    version = "1"
    priority = 0
    device_types = frozenset({"cpu", "cuda"})
    description = "PyTorch reference: defines the numerics of every op; runs anywhere, unfused and slow"
    capabilities = {
        "decode": OpCapability(
            limits={"k_qdq": _ALL_FORMATS, "v_qdq": _ALL_FORMATS, "p_qdq": _ALL_FORMATS},
            features=frozenset({"lse", "fp32_q", "kv_qdq_fp8_cache"}), notes="any page size, heads, widths"),
        "prefill": OpCapability(
            limits={"q_quant": _ALL_FORMATS, "k_quant": _ALL_FORMATS, "p_quant": _ALL_FORMATS,
                    "v_quant": _ALL_FORMATS},
            features=frozenset({"lse", "nm_sparsity", "gqa"}), notes="causal and non-causal, any head dims"),
        "merge": OpCapability(),
        "rope_quantize_fp8": OpCapability(notes="neox and interleaved; positions outside cos/sin give rope 0"),
        "sparse_decode": OpCapability(limits={"kv_layout": frozenset({"fp8", "fp8_ds_mla"})},
                                      features=frozenset({"lse"}),
                                      notes="576-byte FP8 rows (FP8 query) and 656-byte fp8_ds_mla rows (bf16 query)"),
        "layer": OpCapability(features=frozenset({"sinks", "fp8_weights", "sparse"}),
                              notes="mla_forward: bf16/fp16/fp32 cache; FP8 block-scaled or float weights"),
    }

    def decode(self, call, config):
        return decode.mla_decode_reference(call)

    def prefill(self, call, config):
        return prefill.mla_prefill_reference(call)

    def merge(self, call, config):
        return merge.merge_attn_states_reference(call)

    def rope_quantize_fp8(self, call, config):
        return rope.rope_quantize_fp8_reference(call)

    def sparse_decode(self, call, config):
        return sparse.sparse_decode_reference(call)

    def layer(self, call, config):
        return layer.mla_forward_reference(call)
