"""Mutants of the fused MLA layer (mla_core.mla_forward's reference definition, mla_core.layer, mla_core.nn).

Each is one plausible bug the CPU tests must notice; run them with ``python3 tests/mutation/run.py --only layer``.
"""
from __future__ import annotations

_LAYER = "backends/reference/mla_core_reference/layer.py"
_FAST = "tests/test_layer.py -k 'not compile and not any_backend'"

MUTANTS = [
    dict(file=_LAYER,
         old="lat = lat * torch.rsqrt(lat.pow(2).mean(dim=-1, keepdim=True) + call.epsilon) * call.kv_norm_gamma.float()",
         new="lat = lat * torch.rsqrt(lat.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * call.kv_norm_gamma.float()",
         tests=[_FAST],
         why="RMSNorm epsilon: the caller's epsilon ignored (visible on small latent rows)"),
    dict(file=_LAYER,
         old="pos = starts[request] + torch.arange(tokens, device=device) - offsets[request]",
         new="pos = torch.arange(tokens, device=device) - offsets[request]",
         tests=[_FAST],
         why="rope position: tokens rotated (and cached) as if no prefix were cached"),
    dict(file=_LAYER,
         old="cache[page[ok], (pos % page_size)[ok]] = rows[ok]",
         new="cache[page[ok], ((pos + 1) % page_size)[ok]] = rows[ok]",
         tests=[_FAST],
         why="cache write offset: each new row lands one slot late"),
    dict(file="mla_core/layer.py",
         old="        return self.max_seq_len == 1",
         new="        return self.max_seq_len <= 2",
         tests=[_FAST],
         why="decode/prefill switch: a 2-token request runs the one-token decode (and max_seq_len 2 never prefills)"),
    dict(file="mla_core/nn.py",
         old="w_uk_scale=s[:, :nope // b_out].transpose(1, 2).contiguous(),",
         new="w_uk_scale=s[:, nope // b_out:].transpose(1, 2).contiguous(),",
         tests=["tests/test_nn_transformers.py -k fp8"],
         why="block-scale index: w_uk takes the V rows' scales of kv_b_proj (decode steps go wrong)"),
    dict(file="mla_core/layer.py",
         old="    full = scale.float().repeat_interleave(rows_block, dim=-2)[..., :rows, :]",
         new="    full = scale.float().transpose(-1, -2).repeat_interleave(rows_block, dim=-2)[..., :rows, :]",
         tests=[_FAST],
         why="block-scale index: row and column blocks swapped"),
    dict(file=_LAYER,
         old="return torch.sigmoid(lse - sinks.float()[None, :])",
         new="return torch.sigmoid(sinks.float()[None, :] - lse)",
         tests=[_FAST],
         why="sink sign: exp(-sink) added to the denominator instead of exp(sink)"),
    dict(file=_LAYER,
         old="call.max_seq_len, call.softmax_scale, causal=True,",
         new="call.max_seq_len, call.softmax_scale, causal=False,",
         tests=[_FAST],
         why="prefill mask: tokens see later tokens of their request"),
    dict(file="mla_core/nn.py",
         old="        return out if self.o_proj.bias is None else out + self.o_proj.bias",
         new="        return out if self.o_proj.bias is None else out + self.o_proj.bias * self.tp_size",
         tests=["tests/test_tensor_parallel.py"],
         why="row-parallel bias added once per rank instead of once"),
]
