"""Benchmark the fused MLA layer (mla_core.mla_forward) and MLAAttention at DeepSeek-V3 sizes.

    python3 benchmarks/bench_layer.py                  # the issue's shapes on a GPU
    python3 benchmarks/bench_layer.py --smoke          # tiny shapes, any device (checks the script runs)

Three tables, one run, ceilings measured in the same run (copy GB/s, bf16 TFLOP/s):

1. decode step (heads 16 = DeepSeek-V3 at TP=8, and 128 = TP=1; batch 1/32/128; 8192 cached tokens; FP8 128 x 128
   weights): the layer call against
   the sum of its parts timed alone in CUDA graphs (the layer both eagerly and, since its decode path never
   synchronizes with the host, in a CUDA graph; layer/parts uses the faster): the attention kernel (mla_decode with the same shapes,
   automatic dispatch), the absorption GEMM (q_nope [H, B, 128] x w_uk) and the output GEMM (latent [H, B, 512] x
   w_uv), each a bf16 batched matmul on the dequantized weights (the floor an FP8 GEMM would improve on).
   Target: layer <= 1.15 x parts.
2. the whole attention module, MLAAttention.forward (eager with full checks, eager with metadata checks, and a
   CUDA graph) against transformers' DeepseekV3Attention (eager attention, its dense latent cache expanded through
   kv_b_proj every step; the cache passed under the keyword the installed version takes, and the step refused
   unless its attention saw all ``length`` tokens), same bf16 weights, hidden 7168; and MLAAttention with
   ``cuda_graph_decode=True`` (each step: the checks, copy-in, a graph replay, copy-out), full and metadata checks.
   Target: >= 3 x faster. Shapes whose expanded K/V would pass --baseline-gb are skipped.
3. prefill of 4 x 4096 tokens through the layer against the attention kernel alone (mla_prefill on K/V of the same
   shapes): TFLOP/s of the attention FLOPs (causal pairs x heads x 2 x (192 + 128)). Target: >= 70 %.

Writes ``$OUT/bench_layer.json`` when $OUT is set.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

import mla_core  # noqa: E402
from mla_core.bench import causal_pairs, time_cpu  # noqa: E402

NOPE, ROPE, LATENT, V_DIM, HIDDEN, Q_LORA = 128, 64, 512, 128, 7168, 1536
BLOCK = (128, 128)


def _fp8_weight(shape, device, gen_scale=1.0):
    """Random FP8 E4M3 codes and float32 128 x 128 block scales of a weight ``shape`` [..., rows, cols]."""
    codes = (torch.randn(shape, device=device) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    *lead, rows, cols = shape
    scale = torch.rand(*lead, -(-rows // BLOCK[0]), -(-cols // BLOCK[1]), device=device) * gen_scale / 64 / math.sqrt(cols)
    return codes, scale


def layer_inputs(heads, batch, length, new_tokens, device, dtype=torch.bfloat16, page=64, nope=NOPE, rope=ROPE,
                 latent=LATENT, v_dim=V_DIM):
    """mla_forward arguments: ``batch`` requests with ``length - new_tokens`` cached tokens and ``new_tokens`` new."""
    pages_per = -(-length // page)
    cache = torch.randn(batch * pages_per, page, latent + rope, device=device).to(dtype)
    table = torch.randperm(batch * pages_per, device=device).view(batch, pages_per).to(torch.int32)
    w_k, w_k_scale = _fp8_weight((heads * nope, latent), device)
    w_uv, w_uv_scale = _fp8_weight((heads, v_dim, latent), device)
    w_uk = w_k.view(heads, nope, latent).transpose(1, 2).contiguous()
    w_uk_scale = w_k_scale.view(heads, nope // BLOCK[0], -1).transpose(1, 2).contiguous() if nope % BLOCK[0] == 0 \
        else torch.ones(heads, -(-latent // BLOCK[1]), -(-nope // BLOCK[0]), device=device) * w_k_scale.mean()
    angles = torch.rand(length + 1, rope // 2, device=device) * 6.28
    tokens = batch * new_tokens
    return dict(q=torch.randn(tokens, heads, nope + rope, device=device).to(dtype),
                kv=torch.randn(tokens, latent + rope, device=device).to(dtype),
                input_row_offsets=torch.arange(batch + 1, device=device, dtype=torch.int32) * new_tokens,
                freqs_cis=torch.stack((angles.cos(), angles.sin()), -1).flatten(1),
                kv_norm_gamma=torch.ones(latent, device=device, dtype=dtype), latent_cache=cache, block_table=table,
                cache_offsets=torch.full((batch,), length - new_tokens, device=device), max_seq_len=new_tokens,
                w_k=w_k, w_k_scale=w_k_scale, w_uk=w_uk, w_uk_scale=w_uk_scale, w_uv=w_uv, w_uv_scale=w_uv_scale,
                softmax_scale=(nope + rope) ** -0.5)


@contextlib.contextmanager
def _checks(mode):
    """MLA_CORE_CHECKS for the block ("metadata": no value checks, no host sync on the decode path)."""
    before = os.environ.get("MLA_CORE_CHECKS")
    os.environ["MLA_CORE_CHECKS"] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLA_CORE_CHECKS")
        else:
            os.environ["MLA_CORE_CHECKS"] = before


def _layer_backend(a) -> str:
    """The backend automatic dispatch runs the layer call ``a`` on."""
    from mla_core import dispatch, layer
    kw = dict(a)
    pos = [kw.pop(k) for k in ("q", "kv", "input_row_offsets", "freqs_cis", "kv_norm_gamma", "latent_cache",
                               "block_table", "cache_offsets")]
    problem, _ = layer.validate_layer(*pos, epsilon=1e-6, weight_block_size=BLOCK, attn_sinks=None,
                                      rope_interleave=True, attention_backend=None, **kw)
    return dispatch.choose(problem).backend.name


def _timer(device):
    if device == "cuda":
        return (lambda fn, iters=10: time_eager(fn, iters=iters, warmup=2),
                lambda fn, iters=20: time_graph(fn, iters=iters, warmup=2))
    return (lambda fn, iters=3: time_cpu(fn, iters=iters, warmup=1),) * 2


def _wall_timer(device):
    """Median µs of one call and a device synchronize on the host's clock: an eager caller's step latency (the
    host's time plus the GPU's tail). No L2 flush: with one queued before each call, the event-timed eager rows
    hide host time behind the flush kernel (metadata checks) or wait for it at the value checks' host read (full
    checks), so they depend on the flush's length; the GPU-bound baseline reads far more than the L2 anyway."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run(fn, iters=10):
        def step():
            fn()
            sync()
        return time_cpu(step, iters=iters, warmup=2)
    return run


def bench_decode(shapes, device, ceilings):
    eager, graph = _timer(device)
    rows = []
    for heads, batch, length in shapes:
        a = layer_inputs(heads, batch, length, 1, device)
        layer_us = eager(lambda: mla_core.mla_forward(**a))
        with _checks("metadata"):
            layer_meta_us = eager(lambda: mla_core.mla_forward(**a))
        try:
            layer_graph_us = graph(lambda: mla_core.mla_forward(**a))
        except RuntimeError as e:             # an attention backend that cannot be captured
            print(f"layer decode not capturable in a CUDA graph: {e}")
            layer_graph_us = None
        q_dec = torch.randn(batch, heads, LATENT + ROPE, device=device).to(torch.bfloat16)
        lens = torch.full((batch,), length, device=device, dtype=torch.int32)
        attn_us = graph(lambda: mla_core.mla_decode(q_dec, a["latent_cache"], a["block_table"], lens,
                                                     softmax_scale=a["softmax_scale"], kv_lora_rank=LATENT,
                                                     qk_rope_head_dim=ROPE, num_kv_splits="auto", return_lse=True))
        w_uk = (a["w_uk"].float() * a["w_uk_scale"].mean()).to(torch.bfloat16)         # [H, 512, 128]
        w_uv = (a["w_uv"].float() * a["w_uv_scale"].mean()).to(torch.bfloat16)         # [H, 128, 512]
        q_nope = torch.randn(heads, batch, NOPE, device=device).to(torch.bfloat16)
        o_lat = torch.randn(heads, batch, LATENT, device=device).to(torch.bfloat16)
        absorb_us = graph(lambda: torch.bmm(q_nope, w_uk.transpose(1, 2)))
        out_us = graph(lambda: torch.bmm(o_lat, w_uv.transpose(1, 2)))
        parts = attn_us + absorb_us + out_us
        kv_bytes = batch * length * (LATENT + ROPE) * 2
        best = min(t for t in (layer_us, layer_meta_us, layer_graph_us) if t is not None)
        rows.append(dict(heads=heads, batch=batch, length=length, backend=_layer_backend(a), layer_us=layer_us,
                         layer_metadata_us=layer_meta_us, layer_graph_us=layer_graph_us,
                         attention_us=attn_us, absorb_us=absorb_us, out_gemm_us=out_us, parts_us=parts,
                         layer_over_parts=best / parts, target_met=best <= 1.15 * parts,
                         kv_gbps=kv_bytes / best / 1e3,
                         pct_copy=(100 * kv_bytes / best / 1e3 / ceilings["copy_gbps"]) if ceilings else None))
    print("\n# decode step: layer vs its parts (target layer/parts <= 1.15)")
    print_table(rows, [("heads", "heads", "d"), ("batch", "batch", "d"), ("length", "len", "d"),
                       ("backend", "layer on", "s"), ("layer_us", "layer µs", ".1f"),
                       ("layer_metadata_us", "metadata µs", ".1f"), ("layer_graph_us", "graph µs", ".1f"),
                       ("attention_us", "attn µs", ".1f"),
                       ("absorb_us", "w_uk µs", ".1f"), ("out_gemm_us", "w_uv µs", ".1f"),
                       ("layer_over_parts", "layer/parts", ".2f"), ("kv_gbps", "KV GB/s", ".0f"),
                       ("pct_copy", "% copy", ".1f")])
    return rows


def _hf_config(heads):
    from transformers import DeepseekV3Config
    config = DeepseekV3Config(hidden_size=HIDDEN, num_attention_heads=heads, num_key_value_heads=heads,
                              q_lora_rank=Q_LORA, kv_lora_rank=LATENT, qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE,
                              v_head_dim=V_DIM, num_hidden_layers=1, max_position_embeddings=163840,
                              rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                                                   original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
                                                   mscale=1.0, mscale_all_dim=1.0))
    config._attn_implementation = "eager"
    return config


def _hf_cache_keyword(attention_class) -> str:
    """The name DeepseekV3Attention.forward takes its cache under (``cache`` in transformers 5, ``past_key_values``
    / ``past_key_value`` before): a wrong name lands in ``**kwargs`` unused, and the step attends to one token."""
    import inspect
    params = inspect.signature(attention_class.forward).parameters
    return next(name for name in ("cache", "past_key_values", "past_key_value") if name in params)


def bench_module(shapes, device, baseline_gb):
    try:
        from transformers import DynamicCache
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3Attention,
                                                                           DeepseekV3RotaryEmbedding)
    except ImportError:
        print("\n# module vs transformers: skipped (transformers is not installed)")
        return []
    from mla_core.nn import MLAAttention, StaticPageTable
    eager, graph = _timer(device)
    wall = _wall_timer(device)
    rows = []
    for heads, batch, length in shapes:
        config = _hf_config(heads)
        hf = DeepseekV3Attention(config, layer_idx=0).to(device, torch.bfloat16).eval()
        table = StaticPageTable(batch, length + 64, 64, device=device)
        mine = MLAAttention(config, num_pages=table.num_pages, page_size=64, dtype=torch.bfloat16, device=device)
        mine.load_state_dict(hf.state_dict())
        mine.latent_cache.normal_()
        table.lengths.fill_(length - 1)
        hidden = torch.randn(batch, HIDDEN, device=device).to(torch.bfloat16)
        offsets = torch.arange(batch + 1, device=device)
        with torch.no_grad():
            mine_us = eager(lambda: mine(hidden, offsets, table.block_table, table.lengths, max_seq_len=1))
            with _checks("metadata"):
                mine_meta_us = eager(lambda: mine(hidden, offsets, table.block_table, table.lengths, max_seq_len=1))
            mine_graph_us = graph(lambda: mine(hidden, offsets, table.block_table, table.lengths, max_seq_len=1))
            mine_wall_us = wall(lambda: mine(hidden, offsets, table.block_table, table.lengths, max_seq_len=1))
            with _checks("metadata"):
                mine_meta_wall_us = wall(lambda: mine(hidden, offsets, table.block_table, table.lengths,
                                                      max_seq_len=1))
            # the opt-in graph-replayed step: checks on the host, copy-in, replay, copy-out (warm-up: eager, capture)
            replayed = MLAAttention(config, num_pages=table.num_pages, page_size=64, dtype=torch.bfloat16,
                                    device=device, cuda_graph_decode=True)
            replayed.load_state_dict(mine.state_dict())
            replayed.latent_cache.copy_(mine.latent_cache)
            gs = {}
            for mode in ("full", "metadata"):
                with _checks(mode):
                    gs[mode] = eager(lambda: replayed(hidden, offsets, table.block_table, table.lengths,
                                                      max_seq_len=1))
                    gs[mode + "_wall"] = wall(lambda: replayed(hidden, offsets, table.block_table, table.lengths,
                                                               max_seq_len=1))
            graphs = replayed.__dict__.get("_decode_graphs")
            replays = graphs.replays if graphs is not None else 0
            del replayed
        expanded_gb = batch * length * heads * (NOPE + ROPE + V_DIM) * 2 / 1e9
        hf_us = hf_wall_us = None
        if expanded_gb <= baseline_gb:
            rotary = DeepseekV3RotaryEmbedding(config).to(device)
            pos = torch.full((batch, 1), length - 1, device=device)
            cos_sin = rotary(hidden[:, None], pos)
            keyword = _hf_cache_keyword(DeepseekV3Attention)
            # transformers 5 caches the latent rows [B, 1, L, 512] / [B, 1, L, 64]; 4.x the expanded K / V per head
            layouts = [((batch, 1, length - 1, LATENT), (batch, 1, length - 1, ROPE)),
                       ((batch, heads, length - 1, NOPE + ROPE), (batch, heads, length - 1, V_DIM))]
            why = "no cache layout fitted"
            for k_shape, v_shape in layouts:
                try:
                    cache = DynamicCache(config=config)
                except TypeError:                       # transformers < 4.56
                    cache = DynamicCache()
                cache.update(torch.randn(k_shape, device=device).to(torch.bfloat16),
                             torch.randn(v_shape, device=device).to(torch.bfloat16), 0)

                def hf_step(cache=cache):
                    with torch.no_grad():
                        hf(hidden[:, None], position_embeddings=cos_sin, attention_mask=None, **{keyword: cache})
                    seen = cache.get_seq_length(0)
                    cache.crop(-1)                      # drop the new token: the next call sees the same length
                    return seen
                try:
                    seen = hf_step()
                except RuntimeError as e:
                    why, cache = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}", None
                    continue
                if seen == length:
                    hf_us = eager(hf_step, iters=3)
                    hf_wall_us = wall(hf_step, iters=3)
                    break
                why, cache = f"its attention saw {seen} cached tokens, not {length}", None
            if hf_us is None:       # never time a baseline that attends to fewer tokens than ours
                print(f"transformers baseline at {heads} heads, batch {batch} not timed: {why}")
            del cache
        ratio = (lambda mine_time: None if hf_us is None else hf_us / mine_time)
        wall_ratio = (lambda mine_time: None if hf_wall_us is None else hf_wall_us / mine_time)
        rows.append(dict(heads=heads, batch=batch, length=length, module_us=mine_us, module_metadata_us=mine_meta_us,
                         module_graph_us=mine_graph_us, transformers_us=hf_us, speedup=ratio(mine_us),
                         speedup_metadata=ratio(mine_meta_us),
                         target_met=None if hf_us is None else hf_us >= 3 * mine_us,
                         module_wall_us=mine_wall_us, module_metadata_wall_us=mine_meta_wall_us,
                         transformers_wall_us=hf_wall_us, speedup_wall=wall_ratio(mine_wall_us),
                         speedup_wall_metadata=wall_ratio(mine_meta_wall_us),
                         module_graphstep_us=gs["full"], module_graphstep_metadata_us=gs["metadata"],
                         speedup_graphstep=ratio(gs["full"]), speedup_graphstep_metadata=ratio(gs["metadata"]),
                         graphstep_target_met=None if hf_us is None else hf_us >= 3 * gs["full"],
                         module_graphstep_wall_us=gs["full_wall"],
                         module_graphstep_metadata_wall_us=gs["metadata_wall"],
                         speedup_graphstep_wall=wall_ratio(gs["full_wall"]),
                         speedup_graphstep_wall_metadata=wall_ratio(gs["metadata_wall"]), graphstep_replays=replays))
        print(f"module H{heads} B{batch}: eager {mine_us:.1f} µs, metadata {mine_meta_us:.1f}, graph "
              f"{mine_graph_us:.1f}, transformers {'-' if hf_us is None else f'{hf_us:.1f}'}; host clock with a "
              f"synchronize: {mine_wall_us:.1f} / {mine_meta_wall_us:.1f}, transformers "
              f"{'-' if hf_wall_us is None else f'{hf_wall_us:.1f}'}; graph-replayed step (cuda_graph_decode) "
              f"{gs['full']:.1f} / {gs['metadata']:.1f} µs ({replays} replays), host clock {gs['full_wall']:.1f} / "
              f"{gs['metadata_wall']:.1f}", flush=True)
        del hf, mine
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"\n# decode step of the whole attention module vs transformers' eager DeepseekV3Attention "
          f"(target speedup >= 3; '-' = skipped, expanded K/V over {baseline_gb} GB)")
    print_table(rows, [("heads", "heads", "d"), ("batch", "batch", "d"), ("length", "len", "d"),
                       ("module_us", "MLAAttention µs", ".1f"), ("module_metadata_us", "metadata µs", ".1f"),
                       ("module_graph_us", "graph µs", ".1f"), ("transformers_us", "transformers µs", ".1f"), ("speedup", "speedup", ".2f"),
                       ("speedup_metadata", "speedup (metadata)", ".2f")])
    print("\n# the same step with cuda_graph_decode=True (checks, copy-in, graph replay, copy-out; event-timed)")
    print_table(rows, [("heads", "heads", "d"), ("batch", "batch", "d"), ("length", "len", "d"),
                       ("module_graphstep_us", "replayed µs", ".1f"),
                       ("module_graphstep_metadata_us", "metadata µs", ".1f"),
                       ("transformers_us", "transformers µs", ".1f"), ("speedup_graphstep", "speedup", ".2f"),
                       ("speedup_graphstep_metadata", "speedup (metadata)", ".2f"),
                       ("module_graphstep_wall_us", "host clock µs", ".1f"),
                       ("module_graphstep_metadata_wall_us", "host metadata µs", ".1f"),
                       ("speedup_graphstep_wall", "host speedup", ".2f")])
    print("\n# the same steps by the host's clock, one call and a synchronize each, no L2 flush "
          "(an eager caller's latency)")
    print_table(rows, [("heads", "heads", "d"), ("batch", "batch", "d"), ("length", "len", "d"),
                       ("module_wall_us", "MLAAttention µs", ".1f"), ("module_metadata_wall_us", "metadata µs", ".1f"),
                       ("transformers_wall_us", "transformers µs", ".1f"), ("speedup_wall", "speedup", ".2f"),
                       ("speedup_wall_metadata", "speedup (metadata)", ".2f")])
    return rows


def bench_prefill(shapes, device, ceilings):
    eager, _ = _timer(device)
    rows = []
    for heads, batch, length in shapes:
        a = layer_inputs(heads, batch, length, length, device)
        layer_us = eager(lambda: mla_core.mla_forward(**a), iters=5)
        with _checks("metadata"):
            layer_meta_us = eager(lambda: mla_core.mla_forward(**a), iters=5)
        tokens = batch * length
        q = torch.randn(tokens, heads, NOPE + ROPE, device=device).to(torch.bfloat16)
        k = torch.randn(tokens, heads, NOPE + ROPE, device=device).to(torch.bfloat16)
        v = torch.randn(tokens, heads, V_DIM, device=device).to(torch.bfloat16)
        cu = torch.arange(batch + 1, device=device, dtype=torch.int32) * length
        attn_us = eager(lambda: mla_core.mla_prefill(q, k, v, cu, cu, length, a["softmax_scale"], causal=True), iters=5)
        flops = batch * causal_pairs(length, length, True) * heads * 2 * (NOPE + ROPE + V_DIM)
        rows.append(dict(heads=heads, batch=batch, length=length, backend=_layer_backend(a), layer_us=layer_us,
                         layer_metadata_us=layer_meta_us, attention_us=attn_us,
                         pct_of_attention_metadata=100 * attn_us / layer_meta_us,
                         layer_tflops=flops / layer_us / 1e6, attention_tflops=flops / attn_us / 1e6,
                         pct_of_attention=100 * attn_us / layer_us, target_met=attn_us / layer_us >= 0.7,
                         pct_matmul=(100 * flops / layer_us / 1e6 / ceilings["bf16_tflops"]) if ceilings else None))
    print("\n# prefill through the layer vs the attention kernel alone (target >= 70 %)")
    print_table(rows, [("heads", "heads", "d"), ("batch", "batch", "d"), ("length", "len", "d"),
                       ("backend", "layer on", "s"), ("layer_us", "layer µs", ".0f"),
                       ("layer_metadata_us", "metadata µs", ".0f"), ("attention_us", "attn µs", ".0f"),
                       ("layer_tflops", "layer TFLOP/s", ".1f"), ("attention_tflops", "attn TFLOP/s", ".1f"),
                       ("pct_of_attention", "% of attn", ".1f"), ("pct_of_attention_metadata", "% (metadata)", ".1f"),
                       ("pct_matmul", "% bf16 mm", ".1f")])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (any device): check the script runs")
    parser.add_argument("--baseline-gb", type=float, default=24.0,
                        help="skip the transformers baseline where its expanded K/V would exceed this many GB")
    parser.add_argument("--skip", default="", help="comma-separated tables to skip: decode, module, prefill")
    parser.add_argument("--module-shapes", default="",
                        help="heads x batch pairs of the module table, e.g. 16x1,128x1 (default: the decode shapes)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        parser.error("no CUDA device: use --smoke for a CPU run of tiny shapes")
    skip = set(filter(None, args.skip.split(",")))
    if args.smoke:
        decode_shapes, module_shapes, prefill_shapes = [(16, 2, 256)], [(16, 2, 128)], [(16, 2, 128)]
    else:
        decode_shapes = [(h, b, 8192) for h in (16, 128) for b in (1, 32, 128)]
        module_shapes = decode_shapes
        if args.module_shapes:
            module_shapes = [(int(h), int(b), 8192) for h, b in (p.split("x") for p in args.module_shapes.split(","))]
        prefill_shapes = [(16, 4, 4096), (128, 4, 4096)]
    ceilings = measure_ceilings() if device == "cuda" and not {"decode", "prefill"} <= skip else None
    info = device_info()
    print(f"device: {info}\nceilings: {ceilings}")
    result = dict(device=info, ceilings=ceilings)
    if "decode" not in skip:
        result["decode"] = bench_decode(decode_shapes, device, ceilings)
    if "module" not in skip:
        result["module"] = bench_module(module_shapes, device, args.baseline_gb)
    if "prefill" not in skip:
        result["prefill"] = bench_prefill(prefill_shapes, device, ceilings)
    path = write_json("bench_layer.json", result)
    if path:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
