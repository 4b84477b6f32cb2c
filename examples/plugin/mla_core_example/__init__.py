"""An mla_core backend plugin: ``merge_attn_states`` in plain PyTorch.

``pip install -e .`` registers it (entry point group ``mla_core`` in pyproject.toml); then
``mla-core backends`` lists ``example`` and ``mla_core.merge_attn_states(..., backend="example")`` runs it.
"""
from __future__ import annotations

import torch

import mla_core
from mla_core.specs import MergeCall

_FLOAT_DTYPES = {"bfloat16", "float16", "float32"}


class ExampleBackend(mla_core.Backend):
    """Merges two partial attention results by their log-sum-exp, in float32 on the CPU."""

    name = "example"
    version = "0.1.0"  # bump when results or speed change: autotune cache entries record it
    # Dispatch runs the valid backend with the highest priority when nothing is tuned (reference 0, musa_fp8
    # 150, triton 200, cuda 300). Below 0: used only when asked for by name (backend="example") or tuned.
    priority = -10
    device_types = frozenset({"cpu"})
    description = "example: merge_attn_states in plain PyTorch"
    # Per op: the Problem values supported (a parameter not named is unrestricted) and the optional
    # features supported. merge has no features; decode, e.g., has "lse" and "fp32_q".
    capabilities = {"merge": mla_core.OpCapability(limits={"dtype": _FLOAT_DTYPES, "out_dtype": _FLOAT_DTYPES})}

    def merge(self, call: MergeCall, config: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``lse = log(exp(a) + exp(b))``, ``output = exp(a - lse) * prefix + exp(b - lse) * suffix``.

        call.prefix_output / call.suffix_output: [tokens, heads, dim]; call.prefix_lse / call.suffix_lse:
        [heads, tokens] float32 (natural log). An LSE of -inf (mla_core) or +inf (FlashAttention, vLLM) marks
        an empty state that contributes nothing; two empty states give output 0 and LSE -inf. Writes into
        call.output / call.output_lse when given and returns them, else returns new contiguous tensors.
        """
        a, b = (torch.where(x == float("inf"), float("-inf"), x.float()) for x in (call.prefix_lse, call.suffix_lse))
        lse = torch.logaddexp(a, b)                                  # [heads, tokens]; -inf when both are empty
        finite = torch.where(torch.isinf(lse), 0.0, lse)
        w_prefix = torch.exp(a - finite).t()[..., None]              # [tokens, heads, 1]; 0 for an empty state
        w_suffix = torch.exp(b - finite).t()[..., None]
        merged = w_prefix * call.prefix_output.float() + w_suffix * call.suffix_output.float()
        output = call.output if call.output is not None else torch.empty_like(call.prefix_output,
                                                                               memory_format=torch.contiguous_format)
        output_lse = call.output_lse if call.output_lse is not None else torch.empty_like(
            lse, memory_format=torch.contiguous_format)
        output.copy_(merged)
        output_lse.copy_(lse)
        return output, output_lse


@mla_core.hookimpl
def mla_core_backends():
    return [ExampleBackend()]
