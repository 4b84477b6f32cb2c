"""GPU: the fused layer and MLAAttention at DeepSeek-V3 sizes (one layer, 128 heads, kv_lora_rank 512, rope 64).

Run on the device with ``python3 -m pytest -m gpu tests/test_layer*.py``. The inner attention runs on automatic
dispatch (the fastest valid backend); the layer itself on automatic dispatch too (the triton layer for non-sparse
calls; tests/test_layer_triton.py compares it with the reference layer).
"""
from __future__ import annotations

import pytest
import torch

import mla_core
from reference_math import rel_l2

pytestmark = pytest.mark.gpu

DEEPSEEK_V3 = dict(hidden_size=7168, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                   kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                   max_position_embeddings=163840,
                   rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                        original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1.0,
                                        mscale_all_dim=1.0))
CHUNKS = [[37, 128, 1, 300], [16, 0, 64, 5]]
DECODE_STEPS = 16
PAGE = 64


def _hf_outputs(attn, config, histories):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
    rotary = DeepseekV3RotaryEmbedding(config).cuda()
    outs = []
    for hidden in histories:
        n = hidden.shape[0]
        cos, sin = rotary(hidden[None], torch.arange(n, device="cuda")[None])
        mask = torch.full((n, n), float("-inf"), device="cuda").triu(1).to(hidden.dtype)[None, None]
        with torch.no_grad():
            outs.append(attn(hidden[None], position_embeddings=(cos, sin), attention_mask=mask)[0][0])
    return outs


def _run_module(module, hidden_size, dtype, gen):
    from mla_core.nn import StaticPageTable
    batch = len(CHUNKS[0])
    total = max(sum(c[b] for c in CHUNKS) for b in range(batch)) + DECODE_STEPS
    table = StaticPageTable(batch, total, PAGE, device="cuda", generator=gen)
    module.reset_cache(table.num_pages, PAGE)
    module.latent_cache.fill_(float("nan"))
    steps = [torch.tensor(c) for c in CHUNKS] + [torch.ones(batch, dtype=torch.int64)] * DECODE_STEPS
    inputs, outputs = [[] for _ in range(batch)], [[] for _ in range(batch)]
    for lens in steps:
        hidden = (torch.randn(int(lens.sum()), hidden_size, generator=gen) * 0.5).to("cuda", dtype)
        offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0))).cuda()
        with torch.no_grad():
            out = module(hidden, offsets, table.block_table, table.lengths, max_seq_len=int(lens.max()))
        assert not out.isnan().any()
        for b in range(batch):
            inputs[b].append(hidden[offsets[b]:offsets[b + 1]])
            outputs[b].append(out[offsets[b]:offsets[b + 1]])
        table.advance(lens.cuda())
    return [torch.cat(x) for x in inputs], torch.cat([torch.cat(x) for x in outputs])


@pytest.mark.parametrize("fp8", [False, True])
def test_deepseek_v3_attention_matches_transformers(fp8):
    """bf16 (or an FP8 128 x 128 checkpoint) at DeepSeek-V3 sizes against transformers in float32 on the same values."""
    pytest.importorskip("transformers")
    from test_nn_transformers import hf_attention, quantize_state_dict, small_config
    from mla_core.nn import MLAAttention
    config = small_config(**DEEPSEEK_V3)
    attn = hf_attention(config, seed=0).cuda()
    state = {k: v.to(torch.bfloat16).float() for k, v in attn.state_dict().items()}   # values bf16 can hold
    if fp8:
        checkpoint, state = quantize_state_dict(state, (128, 128))
        checkpoint = {k: (v.to(torch.bfloat16) if "layernorm" in k else v) for k, v in checkpoint.items()}
        config.quantization_config = dict(quant_method="fp8", weight_block_size=[128, 128])
    else:
        checkpoint = {k: v.to(torch.bfloat16) for k, v in state.items()}
    attn.load_state_dict(state)
    mine = MLAAttention(config, dtype=torch.bfloat16, device="cuda")
    mine.load_state_dict(checkpoint)
    inputs, out = _run_module(mine, config.hidden_size, torch.bfloat16, torch.Generator().manual_seed(1))
    expected = torch.cat(_hf_outputs(attn, config, [x.float() for x in inputs]))
    assert rel_l2(out, expected) < 1e-2


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("lens,starts,sparse", [([1] * 32, list(range(0, 8192, 256)), False),
                                                ([300, 1, 64], [0, 4000, 63], False),
                                                ([1] * 8, list(range(100, 8100, 1000)), True)])
def test_layer_auto_attention_matches_reference(fp8, lens, starts, sparse):
    """mla_forward at DeepSeek-V3 sizes: automatic attention dispatch equals the reference attention (bf16)."""
    from test_layer import make_case
    case, weights = make_case(lens, starts, dtype=torch.bfloat16, fp8=fp8, sinks=True, heads=128, nope=128, rope=64,
                              latent=512, v_dim=128, block=(128, 128), page=64)
    extra = {}
    if sparse:                          # 2048 of each request's rows (V3.2's top-k), some slots unused
        rows = case["latent_cache"].shape[0] * 64
        extra = dict(sparse_indices=torch.randint(0, rows, (len(lens), 2048), dtype=torch.int32),
                     topk_lengths=torch.randint(1, 2049, (len(lens),), dtype=torch.int32))
        case["latent_cache"] = case["latent_cache"].nan_to_num(0.5)       # every row may be selected
    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    w = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in {**weights.kwargs(), **extra}.items()}
    outs = []
    for backend in ("reference", None):
        cache = case["latent_cache"].clone()
        outs.append(mla_core.mla_forward(case["q"], case["kv"], case["input_row_offsets"], case["freqs_cis"],
                                         case["kv_norm_gamma"], cache, case["block_table"], case["cache_offsets"],
                                         max_seq_len=case["max_seq_len"], softmax_scale=case["softmax_scale"],
                                         epsilon=case["epsilon"], attn_sinks=case["attn_sinks"].cuda(),
                                         attention_backend=backend, **w))
    assert not outs[1].isnan().any()
    assert rel_l2(outs[1], outs[0]) < 1e-2


def test_decode_step_in_a_cuda_graph():
    """A decode step (new rows written, absorbed attention, sinks, FP8 weights) captured once, replayed on new inputs."""
    from test_layer import make_case
    case, weights = make_case([1, 1, 0, 1], [0, 63, 5, 700], dtype=torch.bfloat16, fp8=True, sinks=True, heads=128,
                              nope=128, rope=64, latent=512, v_dim=128, block=(128, 128), page=64)
    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    w = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in weights.kwargs().items()}
    q, kv = case["q"].clone(), case["kv"].clone()
    cache = case["latent_cache"].clone()

    def step():
        return mla_core.mla_forward(q, kv, case["input_row_offsets"], case["freqs_cis"], case["kv_norm_gamma"], cache,
                                    case["block_table"], case["cache_offsets"], max_seq_len=1,
                                    softmax_scale=case["softmax_scale"], epsilon=case["epsilon"],
                                    attn_sinks=case["attn_sinks"], **w)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    q.copy_(torch.randn_like(q))
    kv.copy_(torch.randn_like(kv))
    graph.replay()
    torch.cuda.synchronize()
    replayed, replayed_cache = out.clone(), cache.clone()
    expected = step()                                   # eager, same inputs, same cache slots
    assert rel_l2(replayed, expected) < 1e-6
    assert torch.equal(replayed_cache.nan_to_num(2.0), cache.nan_to_num(2.0))


@pytest.mark.parametrize("fp8", [False, True])
def test_prefill_up_projection_on_tf32_is_the_float32_product(fp8):
    """bf16 latents x FP8 codes (or bf16 weights) are exact in TF32: the CUDA up-projection equals the CPU float32 one."""
    from mla_core_reference.layer import _up_project
    from test_layer import quantize_blocks
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 512, generator=gen).to(torch.bfloat16).float()
    w = torch.randn(128, 128, 512, generator=gen) / 20
    if fp8:
        w, scale = quantize_blocks(w, 128, 128)
    else:
        w, scale = w.to(torch.bfloat16), None
    cpu = _up_project(x, w, scale, (128, 128), torch.bfloat16)
    gpu = _up_project(x.cuda(), w.cuda(), None if scale is None else scale.cuda(), (128, 128), torch.bfloat16)
    assert not torch.backends.cuda.matmul.allow_tf32                  # restored
    assert rel_l2(gpu.cpu(), cpu) < 1e-6
