"""MLAAttention's host-side cuts of the eager step (issue 11): q_a_proj and kv_a_proj_with_mqa as one GEMM.

The two weights (and biases) are views into one fused tensor: the module's parameters, state_dict and
load_state_dict keep transformers' names and shapes, and the step's output equals the two-GEMM step's bit for bit
on the CPU (each output element is the same dot product over the hidden size).
"""
from __future__ import annotations

import copy

import pytest
import torch

from mla_core.nn import MLAAttention, StaticPageTable

pytest.importorskip("transformers")
from test_nn_transformers import PAGE, hf_attention, quantize_state_dict, small_config  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def unfuse(module: MLAAttention) -> None:
    """Give q_a_proj / kv_a_proj_with_mqa storage of their own (values kept): the step runs two GEMMs."""
    for name in ("q_a_proj", "kv_a_proj_with_mqa"):
        for p in module._modules[name].parameters():
            p.data = p.data.clone()


def steps(module: MLAAttention, dtype, seed: int = 1) -> torch.Tensor:
    """A ragged prefill (3 and 5 tokens), a prefill over the cached prefix, then 3 decode steps: every output."""
    table = StaticPageTable(2, 16, PAGE, generator=torch.Generator().manual_seed(seed))
    module.reset_cache(table.num_pages, PAGE)
    module.latent_cache.zero_()
    gen = torch.Generator().manual_seed(seed + 1)
    outs = []
    for lens in ([3, 5], [2, 1], [1, 1], [1, 1], [1, 1]):
        lens = torch.tensor(lens)
        hidden = torch.randn(int(lens.sum()), module.hidden_size, generator=gen).to(dtype)
        offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
        with torch.no_grad():
            outs.append(module(hidden, offsets, table.block_table, table.lengths, max_seq_len=int(lens.max())))
        table.advance(lens)
    return torch.cat(outs)


def loaded(config, dtype, backend="reference", seed=0):
    """(transformers' attention, MLAAttention loaded from its state dict) in ``dtype``."""
    attn = hf_attention(config, seed=seed, dtype=dtype)
    if config.attention_bias:
        with torch.no_grad():
            for m in (attn.q_a_proj, attn.kv_a_proj_with_mqa):
                m.bias.normal_()
    mine = MLAAttention(config, dtype=dtype, attention_backend=backend)
    mine.load_state_dict(attn.state_dict())
    return attn, mine


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_projection_equals_two_gemms_bit_for_bit(dtype, bias, backend):
    """One GEMM + a split gives q_a_proj's and kv_a_proj_with_mqa's outputs exactly (prefill and decode, ragged);
    the fused weight's halves are the loaded transformers weights."""
    config = small_config(attention_bias=bias)
    attn, mine = loaded(config, dtype, backend)
    w, b, split = mine._fused_qkv_a()
    assert split == [config.q_lora_rank, config.kv_lora_rank + config.qk_rope_head_dim]
    assert torch.equal(w, torch.cat((attn.q_a_proj.weight, attn.kv_a_proj_with_mqa.weight)))
    assert (b is None) == (not bias)
    if bias:
        assert torch.equal(b, torch.cat((attn.q_a_proj.bias, attn.kv_a_proj_with_mqa.bias)))
    fused = steps(mine, dtype)
    twin = copy.deepcopy(mine)
    unfuse(twin)
    assert twin._fused_qkv_a() is None
    assert torch.equal(steps(twin, dtype), fused)


def test_parameters_and_state_dict_keep_transformers_names():
    """Same parameter objects' names and shapes as transformers; the state dict round-trips (strict) into a fresh
    module, and the projections' weights in it are the fused tensor's rows."""
    config = small_config()
    attn, mine = loaded(config, torch.float32)
    theirs = {k: tuple(v.shape) for k, v in attn.named_parameters()}
    assert {k: tuple(v.shape) for k, v in mine.named_parameters()} == theirs
    state = mine.state_dict()
    assert sorted(state) == sorted(attn.state_dict())
    for k, v in attn.state_dict().items():
        assert torch.equal(state[k], v)
    w = mine._fused_qkv_a()[0]
    assert state["q_a_proj.weight"].data_ptr() == w.data_ptr()
    assert state["kv_a_proj_with_mqa.weight"].data_ptr() == w[config.q_lora_rank:].data_ptr()
    fresh = MLAAttention(config, attention_backend="reference")
    fresh.load_state_dict(state)
    assert fresh._fused_qkv_a() is not None
    assert torch.equal(steps(fresh, torch.float32), steps(mine, torch.float32))


def test_fusion_follows_updates_reloads_and_moves():
    """An in-place update is seen by the fused GEMM; load_state_dict(assign=True) and a dtype cast fuse again
    (same parameter objects, values kept); a weight given storage of its own runs the two GEMMs, not stale rows."""
    config = small_config(attention_bias=True)
    attn, mine = loaded(config, torch.float32)
    with torch.no_grad():
        mine.kv_a_proj_with_mqa.weight.mul_(2.0)
        mine.q_a_proj.bias.add_(1.0)
    assert mine._fused_qkv_a() is not None
    twin = copy.deepcopy(mine)
    unfuse(twin)
    assert torch.equal(steps(mine, torch.float32), steps(twin, torch.float32))

    mine.load_state_dict({k: v.clone() for k, v in attn.state_dict().items()}, assign=True)
    assert mine._fused_qkv_a() is not None
    assert torch.equal(mine._fused_qkv_a()[0], torch.cat((attn.q_a_proj.weight, attn.kv_a_proj_with_mqa.weight)))

    params = dict(mine.named_parameters())
    mine.to(torch.bfloat16)
    assert all(p is params[k] for k, p in mine.named_parameters() if "proj" in k)
    assert mine._fused_qkv_a() is not None and mine._fused_qkv_a()[0].dtype == torch.bfloat16
    assert torch.equal(mine.q_a_proj.weight, attn.q_a_proj.weight.to(torch.bfloat16))
    assert torch.equal(mine.kv_a_proj_with_mqa.bias, attn.kv_a_proj_with_mqa.bias.to(torch.bfloat16))
    mine.to(torch.float32)
    reference = steps(mine, torch.float32)                  # (the weights now hold bf16 values)

    for name in ("q_a_proj", "kv_a_proj_with_mqa"):      # one parameter at a time given storage of its own
        for leaf in ("weight", "bias"):
            p = getattr(mine._modules[name], leaf)
            p.data = p.data.clone()
            assert mine._fused_qkv_a() is None
            mine.float()
            assert mine._fused_qkv_a() is not None
    unfuse(mine)
    assert torch.equal(steps(mine, torch.float32), reference)
    with torch.no_grad():                                   # the fused tensor still holds the old rows
        mine.kv_a_proj_with_mqa.weight.mul_(0.5)
    unfused = steps(mine, torch.float32)
    assert not torch.allclose(unfused, reference, rtol=1e-2, atol=1e-3)
    mine.float()                                            # any _apply fuses again, values kept
    assert mine._fused_qkv_a() is not None
    assert torch.equal(steps(mine, torch.float32), unfused)


def test_fp8_and_q_proj_models_stay_unfused():
    """FP8 block-scaled projections and a model without q_lora_rank keep their own GEMMs (and still load)."""
    config = small_config()
    attn = hf_attention(config, seed=4)
    fp8_state, _ = quantize_state_dict({k: v.clone() for k, v in attn.state_dict().items()}, (32, 32))
    config.quantization_config = dict(quant_method="fp8", fmt="e4m3", weight_block_size=[32, 32],
                                      activation_scheme="dynamic")
    fp8 = MLAAttention(config, attention_backend="reference")
    fp8.load_state_dict(fp8_state)
    assert fp8._fused_qkv_a() is None and "_qkv_a" not in fp8.__dict__
    assert steps(fp8, torch.float32).isfinite().all()
    no_lora = MLAAttention(small_config(q_lora_rank=None), attention_backend="reference")
    assert no_lora._fused_qkv_a() is None


def test_safetensors_saves_the_fused_views(tmp_path):
    """The two projections share one storage without overlapping: safetensors saves and loads them."""
    safetensors = pytest.importorskip("safetensors.torch")
    config = small_config(attention_bias=True)
    _, mine = loaded(config, torch.bfloat16)
    assert mine._fused_qkv_a() is not None
    path = str(tmp_path / "attn.safetensors")
    safetensors.save_file(mine.state_dict(), path)
    back = safetensors.load_file(path)
    assert sorted(back) == sorted(mine.state_dict())
    assert all(torch.equal(back[k], v) for k, v in mine.state_dict().items())


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


@pytest.mark.gpu
def test_fused_projection_on_the_gpu_at_deepseek_sizes():
    """DeepSeek-V3 sizes (hidden 7168, q_lora 1536, latent 512 + 64), bf16, 16 heads: the fused GEMM's step equals
    the two GEMMs' within the GEMM kernels' accumulation order (cuBLAS may pick another kernel for 2112 rows)."""
    from reference_math import rel_l2
    config = small_config(hidden_size=7168, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                          qk_nope_head_dim=128, v_head_dim=128, num_attention_heads=16, num_key_value_heads=16)
    torch.manual_seed(0)
    mine = MLAAttention(config, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for p in mine.parameters():
            p.normal_(0, 0.02)
    assert mine._fused_qkv_a() is not None
    hidden = torch.randn(3, 7168, device="cuda", dtype=torch.bfloat16)
    table = StaticPageTable(3, 128, 64, device="cuda")
    mine.reset_cache(table.num_pages, 64)
    twin = copy.deepcopy(mine)
    unfuse(twin)
    outs = []
    for module in (mine, twin):
        module.latent_cache.zero_()
        offsets = torch.arange(4, device="cuda")
        with torch.no_grad():
            outs.append(module(hidden, offsets, table.block_table, table.lengths, max_seq_len=1))
    assert rel_l2(outs[0].float(), outs[1].float()) < 1e-2
