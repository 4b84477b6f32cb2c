"""Generate tokens with a small random DeepSeek-V3-shaped model on mla_core attention; prints tokens/s.

    python3 examples/deepseek_tiny/generate.py --steps 32 --batch 4

Random weights (transformers' initializer), so the tokens mean nothing: the point is the serving loop (one
ragged prefill, then decode steps on a paged latent cache per layer) and its speed. Needs ``transformers``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_deepseek import TinyDeepseek, random_hf_model, tiny_config  # noqa: E402

from mla_core.nn import StaticPageTable  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32, help="tokens to generate per request")
    parser.add_argument("--batch", type=int, default=4, help="requests (prompt lengths 3, 10, 17, ...)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--attention-backend", default=None, help="mla_core backend of the attention (default: automatic)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="replay the decode step as a CUDA graph (GPU; every layer dense, no MoE)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1:
        parser.error("--steps and --batch must be at least 1")
    dtype = getattr(torch, args.dtype)
    if args.cuda_graph and not args.device.startswith("cuda"):
        parser.error("--cuda-graph needs --device cuda")
    config = tiny_config(layers=args.layers, **({"first_k_dense_replace": args.layers} if args.cuda_graph else {}))
    hf = random_hf_model(config, dtype=dtype).to(args.device)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(config.vocab_size, (3 + 7 * b,), generator=gen).tolist() for b in range(args.batch)]
    table = StaticPageTable(args.batch, max(map(len, prompts)) + args.steps, args.page_size, device=args.device,
                            generator=gen)
    model = TinyDeepseek(hf, table.num_pages, args.page_size, attention_backend=args.attention_backend)
    start = time.perf_counter()
    tokens, _ = model.generate(prompts, args.steps, table, cuda_graph=args.cuda_graph)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    generated = args.batch * args.steps
    for b, seq in enumerate(tokens):
        print(f"request {b} (prompt {len(prompts[b])} tokens): {seq[:16]}{' ...' if len(seq) > 16 else ''}")
    print(f"{generated} tokens in {seconds:.2f} s: {generated / seconds:.1f} tokens/s "
          f"({args.layers} layers, batch {args.batch}, {args.dtype}, {args.device}"
          f"{', CUDA graph' if args.cuda_graph else ''}; the time includes the prefill"
          f"{' and the capture' if args.cuda_graph else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
