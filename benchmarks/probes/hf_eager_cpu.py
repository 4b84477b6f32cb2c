"""transformers' eager DeepseekV3Attention decode step on the CPU at tiny dims: the host-time floor of issue 11.

Its step at batch 1 is host-bound on a GPU as well, so its time here / 3 is the budget our eager step has on this
CPU (NOTES "Eager decode step, round (m)"). Thread CPU time, one intra-op thread, minimum and median of loops of
300 calls; each call attends to 31 cached tokens and the new row is cropped off the cache again.

    python3 benchmarks/probes/hf_eager_cpu.py [float32|bfloat16] [loops]
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from transformers import DeepseekV3Config, DynamicCache
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_layer  # noqa: E402
from host_overhead import DIMS  # noqa: E402


def main() -> int:
    dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
    loops = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    torch.set_num_threads(1)
    hidden_size, q_lora, latent, nope, rope, v_dim, _ = DIMS["tiny"]
    heads, length = 2, 32
    config = DeepseekV3Config(hidden_size=hidden_size, num_attention_heads=heads, num_key_value_heads=heads,
                              q_lora_rank=q_lora, kv_lora_rank=latent, qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                              v_head_dim=v_dim, num_hidden_layers=1, max_position_embeddings=1 << 16)
    config._attn_implementation = "eager"
    attn = DeepseekV3Attention(config, layer_idx=0).to(dtype).eval()
    hidden = torch.randn(1, 1, hidden_size).to(dtype)
    cos_sin = DeepseekV3RotaryEmbedding(config)(hidden, torch.full((1, 1), length - 1))
    keyword = bench_layer._hf_cache_keyword(DeepseekV3Attention)
    cache = None
    # transformers 5 caches the latent rows; 4.x the expanded K / V per head (as bench_layer tries them)
    for k_shape, v_shape in (((1, 1, length - 1, latent), (1, 1, length - 1, rope)),
                             ((1, heads, length - 1, nope + rope), (1, heads, length - 1, v_dim))):
        cache = DynamicCache(config=config)
        cache.update(torch.randn(k_shape).to(dtype), torch.randn(v_shape).to(dtype), 0)
        try:
            with torch.no_grad():
                attn(hidden, position_embeddings=cos_sin, attention_mask=None, **{keyword: cache})
            cache.crop(-1)
            break
        except RuntimeError:
            cache = None
    if cache is None:
        raise SystemExit("no cache layout fitted this transformers version")

    def step():
        with torch.no_grad():
            attn(hidden, position_embeddings=cos_sin, attention_mask=None, **{keyword: cache})
        cache.crop(-1)
    for _ in range(50):
        step()
    assert cache.get_seq_length(0) == length - 1
    samples = []
    for _ in range(loops):
        start = time.thread_time()
        for _ in range(300):
            step()
        samples.append((time.thread_time() - start) * 1e6 / 300)
    print(f"transformers {dtype} eager DeepseekV3Attention step, tiny dims, {heads} heads, {length - 1} cached: "
          f"median {statistics.median(samples):.1f} µs, min {min(samples):.1f} µs (thread CPU time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
