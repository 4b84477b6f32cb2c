"""MLAAttention's host-side cuts of the eager step (issue 11): what the step caches stays keyed on what it reads.

(The fused q_a / kv_a projection tried in round (h) lives on branch ``wip/fused-qkv-a`` with its tests: on the
H200 its full-checks step measured slower, benchmarks/NOTES.md "eager module host cut: device result".)
"""
from __future__ import annotations

import pytest
import torch

from mla_core.nn import MLAAttention

pytest.importorskip("transformers")
from test_nn_transformers import hf_attention, quantize_state_dict, small_config  # noqa: E402


def test_fp8_layer_weights_follow_scale_updates():
    """layer_weights() is keyed on kv_b_proj's weight and its FP8 scales: an in-place scale update rebuilds it."""
    config = small_config()
    attn = hf_attention(config, seed=4)
    fp8_state, _ = quantize_state_dict({k: v.clone() for k, v in attn.state_dict().items()}, (32, 32))
    config.quantization_config = dict(quant_method="fp8", fmt="e4m3", weight_block_size=[32, 32],
                                      activation_scheme="dynamic")
    mine = MLAAttention(config, attention_backend="reference")
    mine.load_state_dict(fp8_state)
    first = mine.layer_weights()
    assert all(first[k] is v for k, v in mine.layer_weights().items())
    scales = {k: v.clone() for k, v in first.items() if k.endswith("_scale")}     # (w_k_scale is a view)
    with torch.no_grad():
        mine.kv_b_proj.weight_scale_inv.mul_(2.0)
    doubled = mine.layer_weights()
    for name, before in scales.items():
        assert torch.equal(doubled[name], 2 * before)
