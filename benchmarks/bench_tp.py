"""Tensor parallelism of MLAAttention: the decode step with 128 heads on one GPU against 64 heads on each of two.

    torchrun --nproc-per-node 2 benchmarks/bench_tp.py            # two GPUs (NCCL), DeepSeek-V3 sizes
    torchrun --nproc-per-node 2 benchmarks/bench_tp.py --smoke    # two CPU processes (gloo), tiny sizes

Rank 0 first runs the unsharded module (TP=1, all heads) while rank 1 waits; then both run the sharded one
(TP=2: column-parallel q_b_proj / kv_b_proj rows, row-parallel o_proj and an all-reduce), loaded from the
same full checkpoint. Per batch: the decode step's median µs (CUDA-graph replays, L2 flushed; the graph
holds the all-reduce), TP=2 / TP=1 (target <= 0.6) and the relative L2 distance of the two outputs (the
sharded sum is reordered: within bf16 rounding). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
Writes ``$OUT/bench_tp.json`` when $OUT is set.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (the lent machines forbid it)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table, time_graph, write_json  # noqa: E402

from mla_core.bench import time_cpu  # noqa: E402
from mla_core.nn import MLAAttention, StaticPageTable  # noqa: E402


def deepseek_config(smoke: bool):
    """A transformers DeepseekV3Config: DeepSeek-V3's attention sizes, or tiny ones for --smoke."""
    import transformers
    sizes = (dict(hidden_size=64, num_attention_heads=8, q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16,
                  qk_nope_head_dim=32, v_head_dim=32) if smoke else
             dict(hidden_size=7168, num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                  qk_nope_head_dim=128, v_head_dim=128))
    return transformers.DeepseekV3Config(num_key_value_heads=sizes["num_attention_heads"], num_hidden_layers=1,
                                         vocab_size=128, max_position_embeddings=163840, **sizes)


def full_checkpoint(config, dtype, device) -> dict[str, torch.Tensor]:
    """Random attention weights of the whole layer (every rank builds the same ones from one seed)."""
    module = MLAAttention(config, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(1234)
    state = {}
    for name, p in module.state_dict().items():
        if "layernorm" in name:
            state[name] = torch.ones_like(p) + 0.1 * torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype)
        else:
            state[name] = torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype) / math.sqrt(p.shape[-1])
    return state


def decode_step(module, batch: int, length: int, page: int, device, dtype):
    """A closure running one decode step of ``batch`` requests with ``length - 1`` cached tokens, and its output."""
    table = StaticPageTable(batch, length, page, device=device, generator=torch.Generator().manual_seed(5))
    module.reset_cache(table.num_pages, page)
    gen = torch.Generator(device=device).manual_seed(6)
    module.latent_cache.copy_(torch.randn(module.latent_cache.shape, generator=gen, device=device, dtype=dtype))
    table.advance(torch.full((batch,), length - 1))
    hidden = torch.randn(batch, module.hidden_size, generator=gen, device=device, dtype=dtype)
    offsets = torch.arange(batch + 1, device=device, dtype=torch.int64)
    out = torch.empty(batch, module.hidden_size, device=device, dtype=dtype)

    def step():
        with torch.no_grad():
            out.copy_(module(hidden, offsets, table.block_table, table.lengths, max_seq_len=1))
    return step, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU processes (gloo): checks the script runs")
    parser.add_argument("--batch", default=None, help="decode batch sizes (default 1,32,128; smoke 2)")
    parser.add_argument("--length", type=int, default=None, help="cached tokens + 1 (default 8192; smoke 40)")
    parser.add_argument("--page-size", type=int, default=64)
    args = parser.parse_args()
    on_gpu = not args.smoke
    if on_gpu and torch.cuda.device_count() < 2:
        print("bench_tp: needs 2 CUDA GPUs (or --smoke on CPU)", file=sys.stderr)
        return 2
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world != 2:
        print("bench_tp: run it under torchrun --nproc-per-node 2", file=sys.stderr)
        return 2
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    batches = [int(b) for b in (args.batch or ("1,32,128" if on_gpu else "2")).split(",")]
    length = args.length or (8192 if on_gpu else 40)
    page = args.page_size if on_gpu else 8
    time_fn = time_graph if on_gpu else (lambda fn: time_cpu(fn, iters=3))

    config = deepseek_config(args.smoke)
    state = full_checkpoint(config, dtype, device)
    rows = []
    try:
        for batch in batches:
            row = {"heads": config.num_attention_heads, "batch": batch, "length": length}
            if rank == 0:
                full = MLAAttention(config, dtype=dtype, device=device)
                full.load_state_dict(state)
                step, out = decode_step(full, batch, length, page, device, dtype)
                row["tp1_us"] = time_fn(step)
                step()
                reference = out.clone()
                del full, step, out
            dist.barrier()
            sharded = MLAAttention(config, dtype=dtype, device=device, tp_group=dist.group.WORLD)
            sharded.load_state_dict(state)
            step, out = decode_step(sharded, batch, length, page, device, dtype)
            us = time_fn(step)
            step()
            if rank == 0:
                row["tp2_us"] = us
                row["tp2_over_tp1"] = us / row["tp1_us"]
                row["rel_l2"] = float((out.float() - reference.float()).norm() / reference.float().norm())
                rows.append(row)
            del sharded, step, out
            if on_gpu:
                torch.cuda.empty_cache()
        if rank == 0:
            print(f"# MLAAttention decode step, TP=2 ({'2 GPUs, NCCL' if on_gpu else 'CPU, gloo'}) vs TP=1 "
                  "(target TP2 / TP1 <= 0.6)")
            print_table(rows, [("heads", "heads", "d"), ("batch", "batch", "d"), ("length", "len", "d"),
                               ("tp1_us", "TP1 µs", ".1f"), ("tp2_us", "TP2 µs", ".1f"),
                               ("tp2_over_tp1", "TP2/TP1", ".2f"), ("rel_l2", "rel L2", ".1e")])
            path = write_json("bench_tp.json", {"smoke": args.smoke, "rows": rows})
            if path:
                print(f"wrote {path}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
