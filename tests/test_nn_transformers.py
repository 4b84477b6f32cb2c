"""mla_core.nn.MLAAttention against Hugging Face transformers' DeepseekV3Attention, same random weights.

Each request's prompt is prefilled in two ragged chunks (the second over a cached prefix), then 16 decode steps
run on the paged cache. transformers runs each request's whole history once, causally (its output at a token
depends only on the tokens up to it), with eager attention and no cache: an implementation nobody here wrote.
"""
from __future__ import annotations

import pytest
import torch

from mla_core.nn import MLAAttention, StaticPageTable
from reference_math import rel_l2

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3Attention,  # noqa: E402
                                                                   DeepseekV3RotaryEmbedding)

CHUNKS = [[3, 1, 4, 0], [2, 0, 5, 1]]     # prompt tokens per request, in two prefill calls
DECODE_STEPS = 16
PAGE = 4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These ops are tiny: one intra-op thread avoids oversubscribing a shared CI machine (10x faster here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_config(**over):
    """DeepSeek-V3 attention at small sizes: 8 heads, kv_lora_rank 64, rope 16, q_lora_rank 96, nope 32, v 32, YaRN."""
    args = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=96, kv_lora_rank=64,
                qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, num_hidden_layers=1, vocab_size=128,
                intermediate_size=64, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                n_group=1, topk_group=1, max_position_embeddings=256 * 40,
                rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                     original_max_position_embeddings=256, beta_fast=32, beta_slow=1, mscale=1.0,
                                     mscale_all_dim=1.0))
    args.update(over)
    config = transformers.DeepseekV3Config(**args)
    config._attn_implementation = "eager"
    return config


def hf_attention(config, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    attn = DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "layernorm" in name:
                p.normal_(1.0, 0.3)              # non-trivial gammas
    return attn.to(dtype)


def hf_outputs(attn, config, histories):
    """transformers' output for each request's whole history [1, n, hidden] -> list of [n, hidden]."""
    rotary = DeepseekV3RotaryEmbedding(config)
    outs = []
    for hidden in histories:
        n = hidden.shape[0]
        positions = torch.arange(n)[None]
        cos, sin = rotary(hidden[None], positions)
        mask = torch.full((n, n), float("-inf")).triu(1).to(hidden.dtype)[None, None]
        with torch.no_grad():
            out, _ = attn(hidden[None], position_embeddings=(cos, sin), attention_mask=mask)
        outs.append(out[0])
    return outs


def run_mine(module, config, gen, dtype, batch=len(CHUNKS[0])):
    """Two prefill chunks and DECODE_STEPS decode steps; returns (inputs per request, outputs per request)."""
    total = [sum(c[b] for c in CHUNKS) + DECODE_STEPS for b in range(batch)]
    table = StaticPageTable(batch, max(total), PAGE, generator=gen)
    module.reset_cache(table.num_pages, PAGE)
    module.latent_cache.fill_(float("nan"))             # unwritten slots must never be read
    inputs = [[] for _ in range(batch)]
    outputs = [[] for _ in range(batch)]
    steps = [torch.tensor(c) for c in CHUNKS] + [torch.ones(batch, dtype=torch.int64)] * DECODE_STEPS
    for lens in steps:
        hidden = torch.randn(int(lens.sum()), config.hidden_size, generator=gen).to(dtype)
        offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
        with torch.no_grad():
            out = module(hidden, offsets, table.block_table, table.lengths, max_seq_len=int(lens.max()))
        assert out.shape == hidden.shape and out.dtype == dtype
        for b in range(batch):
            inputs[b].append(hidden[offsets[b]:offsets[b + 1]])
            outputs[b].append(out[offsets[b]:offsets[b + 1]])
        table.advance(lens)
    return [torch.cat(x) for x in inputs], [torch.cat(x) for x in outputs]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("q_lora_rank", [96, None])
def test_matches_transformers(dtype, tol, q_lora_rank):
    config = small_config(q_lora_rank=q_lora_rank)
    attn = hf_attention(config, dtype=dtype)
    mine = MLAAttention(config, dtype=dtype, attention_backend="reference")
    mine.load_state_dict(attn.state_dict())            # strict: the same names and shapes
    inputs, outputs = run_mine(mine, config, torch.Generator().manual_seed(1), dtype)
    expected = hf_outputs(attn, config, inputs)
    assert rel_l2(torch.cat(outputs), torch.cat(expected)) < tol


def test_rope_variants_match_transformers():
    """Plain (non-YaRN) RoPE, halves instead of interleaved pairs, YaRN with mscale != mscale_all_dim, and a bias."""
    for over in (dict(rope_parameters=dict(rope_type="default", rope_theta=500.0), rope_interleave=False),
                 dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0,
                                           original_max_position_embeddings=64, mscale=0.9, mscale_all_dim=0.6),
                      max_position_embeddings=512, attention_bias=True)):
        config = small_config(**over)
        attn = hf_attention(config, seed=2)
        if config.attention_bias:
            with torch.no_grad():
                for m in (attn.q_a_proj, attn.kv_a_proj_with_mqa, attn.o_proj):
                    m.bias.normal_()
        mine = MLAAttention(config, attention_backend="reference")
        mine.load_state_dict(attn.state_dict())
        inputs, outputs = run_mine(mine, config, torch.Generator().manual_seed(3), torch.float32)
        assert rel_l2(torch.cat(outputs), torch.cat(hf_outputs(attn, config, inputs))) < 1e-5


def quantize_state_dict(state, block):
    """A DeepSeek-V3 FP8 checkpoint of ``state``: every projection weight as E4M3 codes + ``weight_scale_inv``.

    Returns (fp8 state dict, the float32 state dict of the dequantized values for transformers).
    """
    fp8, dequant = {}, {}
    for key, w in state.items():
        if not key.endswith("proj.weight") and not key.endswith("proj_with_mqa.weight"):
            fp8[key] = dequant[key] = w
            continue
        rows, cols = w.shape
        pr, pc = -(-rows // block[0]) * block[0], -(-cols // block[1]) * block[1]
        blocks = torch.nn.functional.pad(w.float(), (0, pc - cols, 0, pr - rows)).view(
            pr // block[0], block[0], pc // block[1], block[1])
        scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)
        codes = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
        fp8[key] = codes.view(pr, pc)[:rows, :cols].contiguous()
        fp8[key.replace("weight", "weight_scale_inv")] = scale
        dequant[key] = (codes.float() * scale[:, None, :, None]).view(pr, pc)[:rows, :cols].contiguous()
    return fp8, dequant


def test_fp8_checkpoint_matches_transformers():
    """An FP8 checkpoint (weight + weight_scale_inv, 32 x 32 blocks) loads unchanged; transformers runs the
    dequantized weights; the unquantized weights give a measurably different output (the FP8 codes are used)."""
    config = small_config()
    attn = hf_attention(config, seed=4)
    original = {k: v.clone() for k, v in attn.state_dict().items()}
    fp8_state, dequant_state = quantize_state_dict(original, (32, 32))
    config.quantization_config = dict(quant_method="fp8", fmt="e4m3", weight_block_size=[32, 32],
                                      activation_scheme="dynamic")
    mine = MLAAttention(config, attention_backend="reference")
    mine.load_state_dict(fp8_state)
    assert mine.kv_b_proj.weight.dtype == torch.float8_e4m3fn
    inputs, outputs = run_mine(mine, config, torch.Generator().manual_seed(5), torch.float32)
    attn.load_state_dict(dequant_state)
    assert rel_l2(torch.cat(outputs), torch.cat(hf_outputs(attn, config, inputs))) < 1e-5
    attn.load_state_dict(original)
    assert rel_l2(torch.cat(outputs), torch.cat(hf_outputs(attn, config, inputs))) > 1e-3


def test_module_under_torch_compile():
    """torch.compile(fullgraph=True) of MLAAttention's prefill and decode steps: the layer is one custom op."""
    torch._dynamo.reset()
    config = small_config()
    attn = hf_attention(config, seed=6)
    outputs = []
    for compiled in (False, True):
        mine = MLAAttention(config, attention_backend="reference")
        mine.load_state_dict(attn.state_dict())
        step = torch.compile(mine, backend="aot_eager", fullgraph=True) if compiled else mine
        table = StaticPageTable(2, 12, PAGE, generator=torch.Generator().manual_seed(7))
        mine.reset_cache(table.num_pages, PAGE)
        gen = torch.Generator().manual_seed(8)
        outs = []
        for lens in (torch.tensor([3, 5]), torch.tensor([1, 1]), torch.tensor([1, 1])):
            hidden = torch.randn(int(lens.sum()), config.hidden_size, generator=gen)
            offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
            with torch.no_grad():
                outs.append(step(hidden, offsets, table.block_table, table.lengths, max_seq_len=int(lens.max())))
            table.advance(lens)
        outputs.append(torch.cat(outs))
    assert rel_l2(outputs[1], outputs[0]) < 1e-6


def test_sparse_selection_of_every_position_equals_dense():
    """Selecting every cached position (in a shuffled order, with -1 slots) is the dense decode step."""
    config = small_config()
    attn = hf_attention(config, seed=9)
    mine = MLAAttention(config, attention_backend="reference")
    mine.load_state_dict(attn.state_dict())
    table = StaticPageTable(2, 12, PAGE, generator=torch.Generator().manual_seed(10))
    mine.reset_cache(table.num_pages, PAGE)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        mine(torch.randn(9, config.hidden_size, generator=gen), torch.tensor([0, 4, 9]), table.block_table,
             table.lengths, max_seq_len=5)
        table.advance(torch.tensor([4, 5]))
        hidden = torch.randn(2, config.hidden_size, generator=gen)
        cache = mine.latent_cache.clone()
        dense = mine(hidden, torch.tensor([0, 1, 2]), table.block_table, table.lengths, max_seq_len=1)
        indices = torch.full((2, 10), -1, dtype=torch.int32)
        for b in range(2):
            positions = torch.randperm(int(table.lengths[b]) + 1, generator=gen)
            rows = table.block_table[b, positions // PAGE] * PAGE + positions % PAGE
            indices[b, :len(rows)] = rows
        mine.latent_cache.copy_(cache)
        sparse = mine(hidden, torch.tensor([0, 1, 2]), table.block_table, table.lengths, max_seq_len=1,
                      sparse_indices=indices)
    assert rel_l2(sparse, dense) < 1e-5


def test_layer_weights_are_built_once_and_follow_updates():
    """The same w_k / w_uk / w_uv tensors every step (layer backends cache on them), rebuilt after an in-place
    update or a reload of kv_b_proj, and still equal to transformers afterwards."""
    config = small_config()
    attn = hf_attention(config)
    mine = MLAAttention(config, dtype=torch.float32)
    mine.load_state_dict(attn.state_dict())
    first = mine.layer_weights()
    assert all(first[k] is v for k, v in mine.layer_weights().items())
    with torch.no_grad():
        mine.kv_b_proj.weight.mul_(2.0)
    doubled = mine.layer_weights()
    assert torch.equal(doubled["w_uk"], 2 * first["w_uk"]) and torch.equal(doubled["w_uv"], 2 * first["w_uv"])
    mine.load_state_dict(attn.state_dict())                      # back to the checkpoint: rebuilt again
    assert torch.equal(mine.layer_weights()["w_uk"], first["w_uk"])
    inputs, outputs = run_mine(mine, config, torch.Generator().manual_seed(3), torch.float32)
    assert rel_l2(torch.cat(outputs), torch.cat(hf_outputs(attn, config, inputs))) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_equals_transformers_bit_for_bit(dtype):
    """The q / kv latent RMSNorm (one rms_norm on x's dtype, computed in float32) gives transformers' values
    exactly (upcast, normalize, round, multiply by the weight), rows of small, large and mixed magnitudes."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

    from mla_core.nn import RMSNorm
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 96, generator=gen) * torch.logspace(-3, 3, 64)[:, None]
    theirs, mine = DeepseekV3RMSNorm(96, eps=1e-6), RMSNorm(96, eps=1e-6)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(96, generator=gen))
        mine.weight.copy_(theirs.weight)
    theirs, mine = theirs.to(dtype), mine.to(dtype)
    with torch.no_grad():
        assert torch.equal(mine(x.to(dtype)), theirs(x.to(dtype)))
