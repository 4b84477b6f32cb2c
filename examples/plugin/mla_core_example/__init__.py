"""A minimal mla_core backend plugin: ``merge_attn_states`` on the CPU, in plain PyTorch.

Install with ``pip install -e examples/plugin``; then ``mla-core backends`` lists ``example`` and
``mla_core.merge_attn_states(..., backend="example")`` runs it.
"""
import torch

import mla_core


class ExampleBackend(mla_core.Backend):
    name = "example"
    version = "0.1.0"
    priority = -10  # never chosen over the built-ins unless asked for by name (or tuned)
    device_types = frozenset({"cpu"})
    description = "example plugin: merge_attn_states in plain PyTorch"
    capabilities = {"merge": mla_core.OpCapability(limits={"dtype": {"float32", "bfloat16", "float16"}})}

    def merge(self, call, config):
        """call: mla_core.specs.MergeCall (outputs [tokens, heads, dim], lse [heads, tokens])."""
        a, b = call.prefix_lse.T.float(), call.suffix_lse.T.float()  # [tokens, heads]
        lse = torch.logaddexp(a, b)
        safe = torch.where(torch.isinf(lse), 0.0, lse)
        wa = torch.where(torch.isinf(a), 0.0, torch.exp(a - safe))[..., None]
        wb = torch.where(torch.isinf(b), 0.0, torch.exp(b - safe))[..., None]
        out = wa * call.prefix_output.float() + wb * call.suffix_output.float()
        output = call.output if call.output is not None else torch.empty_like(call.prefix_output)
        output.copy_(out)
        output_lse = call.output_lse if call.output_lse is not None else torch.empty_like(call.prefix_lse)
        output_lse.copy_(lse.T)
        return output, output_lse


@mla_core.hookimpl
def mla_core_backends():
    return [ExampleBackend()]
