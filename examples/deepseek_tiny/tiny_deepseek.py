"""A small DeepSeek-V3-shaped language model whose attention layers are ``mla_core.nn.MLAAttention``.

``TinyDeepseek`` takes a transformers ``DeepseekV3ForCausalLM`` (random weights here; a real checkpoint works the
same) and keeps its embedding, RMSNorms, dense MLP / MoE blocks and LM head, replacing every layer's attention by
an ``MLAAttention`` loaded from the same weights. All layers share one block table and one set of cached lengths
(a ``StaticPageTable``); each layer owns its latent cache. Requests are ragged: a step takes any number of new
tokens per request (a prompt, a chunk of one, or one decode token).
"""
from __future__ import annotations

import torch
from torch import nn

from mla_core.nn import MLAAttention, StaticPageTable


def tiny_config(layers: int = 2, **over):
    """A DeepSeek-V3 config at toy sizes (one dense layer, then MoE layers; YaRN RoPE; 8 heads, latent 64)."""
    import transformers
    args = dict(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=layers,
                num_attention_heads=8, num_key_value_heads=8, q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16,
                qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                first_k_dense_replace=1, max_position_embeddings=4096,
                rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                     original_max_position_embeddings=1024, beta_fast=32, beta_slow=1, mscale=1.0,
                                     mscale_all_dim=1.0))
    args.update(over)
    config = transformers.DeepseekV3Config(**args)
    config._attn_implementation = "eager"
    return config


def random_hf_model(config, seed: int = 0, dtype=torch.float32):
    """transformers' DeepseekV3ForCausalLM with random weights (its own initializer), in eval mode."""
    import transformers
    torch.manual_seed(seed)
    return transformers.DeepseekV3ForCausalLM(config).eval().to(dtype)


class TinyDeepseek(nn.Module):
    """DeepSeek-V3 decoder on mla_core attention, sharing every other module with ``hf_model``.

    Args:
        hf_model: a transformers ``DeepseekV3ForCausalLM``.
        num_pages, page_size: each layer's latent cache size.
        attention_backend: backend of the inner attention ops (None: automatic dispatch).
    """

    def __init__(self, hf_model, num_pages: int, page_size: int, attention_backend: str | None = None):
        super().__init__()
        config = hf_model.config
        dtype, device = hf_model.lm_head.weight.dtype, hf_model.lm_head.weight.device
        self.embed_tokens = hf_model.model.embed_tokens
        self.norm = hf_model.model.norm
        self.lm_head = hf_model.lm_head
        self.blocks = nn.ModuleList()
        self.attention = nn.ModuleList()
        for layer in hf_model.model.layers:
            self.blocks.append(nn.ModuleDict(dict(input_layernorm=layer.input_layernorm, mlp=layer.mlp,
                                                  post_attention_layernorm=layer.post_attention_layernorm)))
            attn = MLAAttention(config, num_pages=num_pages, page_size=page_size, dtype=dtype, device=device,
                                attention_backend=attention_backend)
            attn.load_state_dict(layer.self_attn.state_dict())
            self.attention.append(attn)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, input_row_offsets: torch.Tensor, table: StaticPageTable,
                max_seq_len: int) -> torch.Tensor:
        """Logits [tokens, vocab] of packed new ``tokens`` [tokens]; advances ``table`` by each request's count."""
        h = self.embed_tokens(tokens)
        for block, attn in zip(self.blocks, self.attention):
            h = h + attn(block["input_layernorm"](h), input_row_offsets, table.block_table, table.lengths, max_seq_len)
            h = h + block["mlp"](block["post_attention_layernorm"](h)[None])[0]
        table.advance(input_row_offsets[1:] - input_row_offsets[:-1])
        return self.lm_head(self.norm(h))

    def capture_decode_step(self, batch: int, table: StaticPageTable):
        """A CUDA graph of one decode step (one token per request): returns ``(graph, tokens, logits, offsets)``.

        Copy the next tokens into ``tokens`` [batch] and ``graph.replay()``: ``logits`` [batch, vocab] is refreshed
        and ``table.lengths`` advances. Needs dense layers (MoE routing reads values on the host).
        """
        if any(type(block["mlp"]).__name__.endswith("MoE") for block in self.blocks):
            raise ValueError("CUDA graphs need dense layers: transformers' MoE routing synchronizes with the host "
                             "(build the config with first_k_dense_replace = num_hidden_layers)")
        device = self.lm_head.weight.device
        tokens = torch.zeros(batch, dtype=torch.int64, device=device)
        offsets = torch.arange(batch + 1, device=device)
        saved = table.lengths.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self(tokens, offsets, table, 1)      # warm-up: kernels compiled, dispatch decided
        torch.cuda.current_stream().wait_stream(stream)
        table.lengths.copy_(saved)               # the warm-up's cache rows are rewritten by the first replay
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self(tokens, offsets, table, 1)
        # The graph reads `offsets` at replay but does not own it: return it too, or its memory is freed here and
        # reused (seen on the H200: a replay read garbage offsets and tripped a device-side assert).
        return graph, tokens, logits, offsets

    def generate(self, prompts: list[list[int]], steps: int, table: StaticPageTable,
                 cuda_graph: bool = False) -> tuple[list[list[int]], list]:
        """Greedy decoding: one ragged prefill of every prompt, then ``steps`` decode steps of one token each.

        ``cuda_graph``: replay one captured decode step (:meth:`capture_decode_step`) instead of eager calls.
        Returns (generated tokens per request, the logits of each step [requests, vocab]).
        """
        device = self.lm_head.weight.device
        lens = torch.tensor([len(p) for p in prompts], device=device)
        offsets = torch.cat((torch.zeros(1, dtype=torch.int64, device=device), lens.cumsum(0)))
        tokens = torch.tensor([t for p in prompts for t in p], device=device)
        logits = self(tokens, offsets, table, int(lens.max()))[offsets[1:] - 1]
        out, step_logits = [[] for _ in prompts], [logits]
        one_each = torch.arange(len(prompts) + 1, device=device)
        graph = self.capture_decode_step(len(prompts), table) if cuda_graph and steps > 1 else None
        for step in range(steps):
            nxt = logits.argmax(-1)
            for b, t in enumerate(nxt.tolist()):
                out[b].append(t)
            if step == steps - 1:
                break
            if graph is None:
                logits = self(nxt, one_each, table, 1)
            else:
                graph[1].copy_(nxt)
                graph[0].replay()
                logits = graph[2].clone()
            step_logits.append(logits)
        return out, step_logits
