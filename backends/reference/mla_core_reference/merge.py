"""Reference merge of two partial attention results by their log-sum-exp (float32 math)."""
from __future__ import annotations

import torch

from mla_core import numerics, specs

_NEG_INF = float("-inf")


def merge_attn_states_reference(call: specs.MergeCall) -> tuple[torch.Tensor, torch.Tensor]:
    """``lse = log(exp(a) + exp(b))``, ``out = exp(a - lse) * prefix + exp(b - lse) * suffix``.

    Outputs [tokens, heads, dim], LSEs [heads, tokens] float32. An input LSE of -inf or +inf marks an
    empty state (+inf is how FlashAttention, FlashMLA and vLLM report a row with no key; vLLM's merge
    reads it as empty): it contributes nothing. A row where both states are empty gives output 0 and
    LSE -inf. Writes into ``call.output`` / ``call.output_lse`` when given and returns them; otherwise a
    new contiguous output in prefix_output's dtype and a new contiguous float32 LSE.
    """
    a, b = (numerics.empty_state_lse(x.float()) for x in (call.prefix_lse, call.suffix_lse))
    lse = numerics.merge_lse(a, b)                                         # [heads, tokens]
    empty = lse == _NEG_INF
    # weights relative to the larger LSE, not to the float32-rounded lse: at |lse| ~ 1e4 one float32 step of
    # lse is ~1e-3, which exp(a - lse) would carry into the output
    top = torch.where(empty, 0.0, torch.maximum(a, b))
    e_prefix, e_suffix = torch.exp(a - top), torch.exp(b - top)
    total = torch.where(empty, 1.0, e_prefix + e_suffix)
    w_prefix = (e_prefix / total).t()[..., None]                           # [tokens, heads, 1]
    w_suffix = (e_suffix / total).t()[..., None]
    merged = w_prefix * call.prefix_output.float() + w_suffix * call.suffix_output.float()
    merged = torch.where(empty.t()[..., None], 0.0, merged)
    if call.output is not None:
        output = call.output.copy_(merged)
    else:  # the weights' transposed layout would otherwise carry over to the result's strides
        output = merged.to(call.prefix_output.dtype).contiguous()
    if call.output_lse is not None:
        output_lse = call.output_lse.copy_(lse)
    else:
        output_lse = lse.contiguous()
    return output, output_lse
