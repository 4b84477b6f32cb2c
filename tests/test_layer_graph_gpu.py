"""GPU: MLAAttention's decode step replayed as a CUDA graph (``cuda_graph_decode=True``) against the eager step.

DeepSeek-V3 sizes (hidden 7168, q_lora 1536, latent 512, rope 64, nope 128, v 128; bf16, page 64), 16 and 128
heads. Two modules with the same weights and cache contents, one eager, one graphed, fed the same steps: outputs
and cache rows must be bit-equal (the graph replays the kernels the eager step chose: docs/plugins.md, "Eager
calls and CUDA-graph captures").
"""
from __future__ import annotations

import pytest
import torch

from mla_core.errors import MLAInputError

pytestmark = pytest.mark.gpu

DEEPSEEK_V3 = dict(hidden_size=7168, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                   v_head_dim=128, max_position_embeddings=163840,
                   rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                        original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1.0,
                                        mscale_all_dim=1.0))
PAGE = 64
STEPS = 16


def _pair(heads, starts):
    """(config, eager module, graphed module, page table) with the same weights and cache contents."""
    pytest.importorskip("transformers")
    from test_nn_transformers import small_config
    from mla_core.nn import MLAAttention, StaticPageTable
    config = small_config(**DEEPSEEK_V3, num_attention_heads=heads, num_key_value_heads=heads)
    torch.manual_seed(0)
    table = StaticPageTable(len(starts), max(starts) + STEPS + 1, PAGE, device="cuda",
                            generator=torch.Generator().manual_seed(1))
    kw = dict(num_pages=table.num_pages, page_size=PAGE, dtype=torch.bfloat16, device="cuda")
    eager = MLAAttention(config, **kw)
    graphed = MLAAttention(config, cuda_graph_decode=True, **kw)
    graphed.load_state_dict(eager.state_dict())
    eager.latent_cache.normal_()
    graphed.latent_cache.copy_(eager.latent_cache)
    table.lengths.copy_(torch.tensor(starts))
    return config, eager, graphed, table


def _step(config, eager, graphed, table, gen):
    """One decode step on both modules (the graphed one gets copies at new addresses); (eager out, graphed out)."""
    batch = table.lengths.shape[0]
    hidden = torch.randn(batch, config.hidden_size, generator=gen).to("cuda", torch.bfloat16)
    offsets = torch.arange(batch + 1, device="cuda")
    with torch.no_grad():
        want = eager(hidden, offsets, table.block_table, table.lengths, max_seq_len=1)
        got = graphed(hidden.clone(), offsets.clone(), table.block_table.clone(), table.lengths.clone(),
                      max_seq_len=1)
    table.advance(torch.ones(batch, dtype=torch.int64))
    return want, got


@pytest.mark.parametrize("mode", ["full", "metadata"])
@pytest.mark.parametrize("heads,starts", [(16, [8100]), (16, [0, 63, 700]), (128, [8100]), (128, [0, 63, 700])])
def test_replayed_steps_bit_equal_to_eager(heads, starts, mode, monkeypatch):
    """16 steps: each output and every cache row bit-equal to the eager module's; one capture, 14 replays after
    it; the output of step i unchanged after the later steps."""
    monkeypatch.setenv("MLA_CORE_CHECKS", mode)
    config, eager, graphed, table = _pair(heads, starts)
    gen = torch.Generator().manual_seed(2)
    outs, copies = [], []
    for i in range(STEPS):
        want, got = _step(config, eager, graphed, table, gen)
        assert torch.equal(got, want), f"step {i}"
        outs.append(got)
        copies.append(got.clone())
    graphs = graphed._decode_graphs
    assert (graphs.captures, graphs.replays) == (1, STEPS - 1)        # step 0 eager; step 1 captures and replays
    assert torch.equal(graphed.latent_cache, eager.latent_cache)
    torch.cuda.synchronize()
    for out, copy in zip(outs, copies):
        assert torch.equal(out, copy)


def test_bad_input_raises_before_any_launch():
    """After the capture, a page outside the cache, a negative length and wrong offsets raise MLAInputError
    (full checks) with the cache and the replay count unchanged; the next good step still matches."""
    config, eager, graphed, table = _pair(16, [5, 300])
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        _step(config, eager, graphed, table, gen)
    graphs = graphed._decode_graphs
    replays, cache = graphs.replays, graphed.latent_cache.clone()
    hidden = torch.randn(2, config.hidden_size, device="cuda", dtype=torch.bfloat16)
    offsets = torch.arange(3, device="cuda")
    for bad in (dict(block_table=table.block_table.clone().fill_(table.num_pages)),
                dict(cache_lengths=table.lengths - 400),
                dict(input_row_offsets=torch.tensor([0, 2, 2], device="cuda"))):
        args = dict(hidden_states=hidden, input_row_offsets=offsets, block_table=table.block_table,
                    cache_lengths=table.lengths)
        args.update(bad)
        with pytest.raises(MLAInputError), torch.no_grad():
            graphed(**args, max_seq_len=1)
    torch.cuda.synchronize()
    assert graphs.replays == replays
    assert torch.equal(graphed.latent_cache, cache)
    want, got = _step(config, eager, graphed, table, gen)
    assert torch.equal(got, want)


@pytest.mark.parametrize("heads", [16, 128])
def test_recapture_after_reset_cache(heads):
    """reset_cache gives a new cache address: one eager step, then a new capture, still bit-equal."""
    config, eager, graphed, table = _pair(heads, [100, 4000])
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        _step(config, eager, graphed, table, gen)
    graphed.reset_cache(table.num_pages, PAGE)
    graphed.latent_cache.copy_(eager.latent_cache)
    for i in range(4):
        want, got = _step(config, eager, graphed, table, gen)
        assert torch.equal(got, want), f"step {i} after the reset"
    graphs = graphed._decode_graphs
    assert graphs.captures == 2 and graphs.replays == 2 + 3
    assert torch.equal(graphed.latent_cache, eager.latent_cache)
