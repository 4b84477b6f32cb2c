"""``mla_prefill`` through cuDNN's fused attention, as torch exposes it (``aten._cudnn_attention_forward``).

Ragged batches use cuDNN's ragged offsets: the op's ``cu_seqlens`` are the cumulative offsets cuDNN
takes, so nothing is padded and nothing is read on the host (the call can be captured in a CUDA graph).

Causal. torch's ragged path masks from the top left of each sequence (query i sees keys ``j <= i``);
the op's rule is bottom-right (``j <= i + len_k - len_q``). The two agree when ``len_q == len_k``,
which metadata proves when ``cu_seqlens_q`` and ``cu_seqlens_k`` are the same memory, or for one
sequence whose q and k hold the same token count: then one call serves. Otherwise every sequence is
cut, on the device, into two pieces computed by two calls and merged through their LSE:

- A (non-causal): all its queries against its prefix keys ``[0, len_k - len_q)``, which every query sees;
- B (top-left causal): its last ``m = min(len_q, len_k)`` queries against its last ``m`` keys, a square
  where top-left is the op's rule (its first ``len_q - m`` queries see no key at all).

Each call takes cumulative offsets that interleave a sequence's two pieces (``2 * batch + 1`` entries),
so the packed tensors are used in place; the FLOPs are those of one bottom-right call.

Quantization. Q and K (along features) and V (along keys, NVFP4 blocks of 16 from each sequence's first
key, placed by a device-side scatter into a block-aligned buffer) are fake-quantized with
:mod:`mla_core.numerics` exactly as the reference does; cuDNN then gets the codes with the per-tensor
factors taken out (``qdq(x) / factor``, exact in bf16 and fp16) and the factors folded into the softmax
scale (Q, K) and into the output (V). P is never quantized (the backend refuses ``p_quant``).
"""
from __future__ import annotations

from typing import Callable

import torch

from mla_core import numerics, specs
from mla_core.errors import MLAInputError

from . import finish
from .backend import OFFSET_LIMIT

Attend = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def lse_heads_tokens(lse: torch.Tensor, tokens: int, heads: int) -> torch.Tensor:
    """cuDNN's logsumexp as a [heads, tokens] view: torch 2.11..2.13 return [tokens, heads, 1], later ones [heads, tokens]."""
    if lse.dim() == 3 and tuple(lse.shape) == (tokens, heads, 1):
        return lse[..., 0].t()
    if lse.dim() == 2 and tuple(lse.shape) == (heads, tokens):
        return lse
    raise RuntimeError(f"aten._cudnn_attention_forward returned a logsumexp of shape {list(lse.shape)}; the cudnn "
                       f"backend knows [{tokens}, {heads}, 1] and [{heads}, {tokens}]")


def cudnn_attend(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float,
                 need_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ragged cuDNN attention call (top-left causal when ``causal``).

    q [tokens, heads, qk_dim], k [keys, kv_heads, qk_dim], v [keys, kv_heads, v_dim] (bf16/fp16, contiguous);
    cu_q / cu_k int32 [pieces + 1]; max_q / max_k bound the piece lengths. Returns (out [tokens, heads,
    v_dim] in q's dtype, LSE as a [heads, tokens] float32 view or None). Rows of pieces without keys
    hold whatever cuDNN leaves there.
    """
    result = torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu_q, cu_k, max_q, max_k, need_lse, 0.0, causal,
                                                      False, scale=scale)
    out = result[0]
    return out, (lse_heads_tokens(result[1], q.shape[0], q.shape[1]) if need_lse else None)


def _float32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _codes(x: torch.Tensor, fmt: str | None, amax: float | None, qdq=None) -> tuple[torch.Tensor, float]:
    """(the fake-quantized ``x`` divided by its per-tensor factor, in x's dtype; that factor as float32).

    The quotient of a QDQ value by its factor is an E4M3 code or an E2M1 x E4M3 product (at most 6
    significant bits, magnitudes 2^-10..2688), exact in bf16 and fp16.
    """
    if fmt is None:
        return x, 1.0
    factor = numerics.fp8_scale(amax) if fmt == "fp8" else numerics.nvfp4_global_scale(amax)
    values = numerics.qdq(x, fmt, amax, dim=-1) if qdq is None else qdq
    if factor != 1.0:
        values = numerics.divide(values, factor)
    return values.to(x.dtype), _float32(factor)


def qdq_v_per_sequence(v: torch.Tensor, cu_k: torch.Tensor, amax: float | None) -> torch.Tensor:
    """NVFP4 QDQ of V [keys, kv_heads, v_dim] along keys, in blocks of 16 from each sequence's first key.

    Each sequence is scattered to a row that is a multiple of 16 in a zero-filled buffer (zeros never
    raise a block maximum, as in the reference's padded tail block), quantized there in one call of
    :func:`mla_core.numerics.qdq_nvfp4`, and gathered back. Device ops only; every index is clamped into
    the buffer, so inconsistent ``cu_seqlens_k`` can give wrong values but never an out-of-range access.
    """
    keys, batch = v.shape[0], cu_k.shape[0] - 1
    cu = cu_k.long()
    lens = (cu[1:] - cu[:-1]).clamp_min(0)
    blocks = (lens + numerics.NVFP4_BLOCK - 1) // numerics.NVFP4_BLOCK
    first_block = torch.cumsum(blocks, 0) - blocks
    rows = torch.arange(keys, device=v.device)
    seq = torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_max(batch - 1)
    capacity = numerics.NVFP4_BLOCK * (keys // numerics.NVFP4_BLOCK + batch + 1)
    dest = (first_block[seq] * numerics.NVFP4_BLOCK + rows - cu[seq]).clamp(0, capacity - 1)
    padded = v.new_zeros((capacity,) + tuple(v.shape[1:]))
    padded.index_copy_(0, dest, v)
    return numerics.qdq_nvfp4(padded, amax, dim=0).index_select(0, dest)


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x contiguous with a 16-byte aligned start, as cuDNN's ragged tensors need (a copy only when not)."""
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


def _same_lengths(call: specs.PrefillCall) -> bool:
    """Whether metadata alone proves len_q == len_k for every sequence."""
    a, b = call.cu_seqlens_q, call.cu_seqlens_k
    if a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.stride() == b.stride():
        return True
    return a.shape[0] == 2 and call.q.shape[0] == call.k.shape[0]


def _check_offsets(call: specs.PrefillCall) -> None:
    """Metadata check: every ragged offset (token x elements per token) fits the int32 torch hands cuDNN."""
    out_width = call.q.shape[1] * call.v.shape[2]
    for name, t in (("q", call.q), ("k", call.k), ("v", call.v)):
        width = t.shape[1] * t.shape[2]
        width = max(width, out_width) if name == "q" else width
        if t.shape[0] * width >= OFFSET_LIMIT:
            raise MLAInputError(f"{name}: got {t.shape[0]} tokens x {width} elements, needs fewer than {OFFSET_LIMIT} "
                                "elements for the cudnn backend (torch gives cuDNN int32 ragged offsets); use another "
                                "backend or a smaller batch")


def _row_positions(cu_q: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence index, position in its sequence) of every packed query row, int64 [tokens]."""
    cu = cu_q.long()
    rows = torch.arange(tokens, device=cu_q.device)
    seq = torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_max(cu.shape[0] - 2)
    return seq, rows - cu[seq]


def _pieces(cu: torch.Tensor, split: torch.Tensor) -> torch.Tensor:
    """Cumulative offsets [2 * batch + 1] of each sequence cut at ``split`` [batch] (from its start)."""
    out = torch.empty(2 * cu.shape[0] - 1, dtype=torch.int32, device=cu.device)
    out[:1] = cu[:1]
    out[1::2] = cu[:-1] + split
    out[2::2] = cu[1:]
    return out


def run(call: specs.PrefillCall, config: dict, attend: Attend = cudnn_attend) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one validated prefill call; ``attend`` is the cuDNN call (tests pass an emulation of it).

    Returns (out [total_q, heads, v_dim] in v's dtype, LSE [heads, total_q] float32 or None).
    """
    _check_offsets(call)
    total_q, heads, _ = call.q.shape
    total_k, v_dim = call.k.shape[0], call.v.shape[2]
    if total_q == 0 or total_k == 0:
        out = call.v.new_zeros((total_q, heads, v_dim))
        lse = torch.full((heads, total_q), float("-inf"), dtype=torch.float32, device=call.q.device)
        return out, (lse if call.return_lse else None)

    q, q_factor = _codes(call.q, call.q_quant, call.q_amax)
    k, k_factor = _codes(call.k, call.k_quant, call.k_amax)
    v_qdq = qdq_v_per_sequence(call.v, call.cu_seqlens_k, call.v_amax) if call.v_quant == "nvfp4" else None
    v, v_factor = _codes(call.v, call.v_quant, call.v_amax, qdq=v_qdq)
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    scale = _float32(call.softmax_scale) * q_factor * k_factor
    cu_q = call.cu_seqlens_q.to(torch.int32)
    cu_k = call.cu_seqlens_k.to(torch.int32)
    max_q = max(call.max_seqlen_q, 1)

    if call.causal and _same_lengths(call):
        # every row of a sequence with len_q == len_k >= 1 sees at least its own key: nothing to mask
        out, lse = attend(q, k, v, cu_q, cu_k, max_q, max_q, True, scale, call.return_lse)
        lse = None if lse is None else lse.contiguous()
    elif not call.causal:
        out, lse = attend(q, k, v, cu_q, cu_k, max_q, total_k, False, scale, call.return_lse)
        seq, _ = _row_positions(cu_q, total_q)
        has_keys = ((cu_k[1:] - cu_k[:-1]) > 0)[seq].to(torch.int8)
        out, lse = finish.mask_rows(out, lse, has_keys)
    else:
        len_q = (cu_q[1:] - cu_q[:-1]).clamp_min(0)
        len_k = (cu_k[1:] - cu_k[:-1]).clamp_min(0)
        prefix = (len_k - len_q).clamp_min(0)      # keys every query of the sequence sees
        blind = (len_q - len_k).clamp_min(0)       # leading queries that see no key
        cu_k_pieces = _pieces(cu_k, prefix)
        out_a, lse_a = attend(q, k, v, _pieces(cu_q, len_q), cu_k_pieces, max_q, total_k, False, scale, True)
        out_b, lse_b = attend(q, k, v, _pieces(cu_q, blind), cu_k_pieces, max_q, total_k, True, scale, True)
        seq, pos = _row_positions(cu_q, total_q)
        ok_a = (prefix[seq] > 0).to(torch.int8)
        ok_b = (pos >= blind[seq]).to(torch.int8)
        out, lse = finish.merge(out_a, lse_a, ok_a, out_b, lse_b, ok_b, call.return_lse)

    if v_factor != 1.0:
        out = (out.float() * v_factor).to(call.v.dtype)
    return out, lse
