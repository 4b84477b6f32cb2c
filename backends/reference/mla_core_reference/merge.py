"""Reference merge of two partial attention results by their log-sum-exp (float32 math)."""
from __future__ import annotations

import torch

from mla_core import numerics, specs


def merge_attn_states_reference(call: specs.MergeCall) -> tuple[torch.Tensor, torch.Tensor]:
    """``lse = log(exp(a) + exp(b))``, ``out = exp(a - lse) * prefix + exp(b - lse) * suffix``.

    Outputs [tokens, heads, dim], LSEs [heads, tokens] float32. A row where both LSEs are -inf gives
    output 0 and LSE -inf. Writes into ``call.output`` / ``call.output_lse`` when given and returns them;
    otherwise a new output in prefix_output's dtype and a new float32 LSE.
    """
    a, b = call.prefix_lse.float(), call.suffix_lse.float()
    lse = numerics.merge_lse(a, b)                                         # [heads, tokens]
    empty = lse == float("-inf")
    lse_safe = torch.where(empty, 0.0, lse)
    w_prefix = torch.exp(a - lse_safe).t()[..., None]                      # [tokens, heads, 1]
    w_suffix = torch.exp(b - lse_safe).t()[..., None]
    merged = w_prefix * call.prefix_output.float() + w_suffix * call.suffix_output.float()
    merged = torch.where(empty.t()[..., None], 0.0, merged)
    if call.output is not None:
        output = call.output.copy_(merged)
    else:
        output = merged.to(call.prefix_output.dtype)
    if call.output_lse is not None:
        output_lse = call.output_lse.copy_(lse)
    else:
        output_lse = lse
    return output, output_lse
