"""``mla_prefill`` through cuDNN's fused attention, as torch exposes it.

Dense batches. When shapes alone prove every sequence the same length (one sequence, or one
``cu_seqlens`` tensor with ``total_q == total_k == batch * max_seqlen_q``:
:func:`mla_core.specs.prefill_dense_batch`) and q and k have the same head count, the packed tensors
are viewed as ``[batch, heads, length, dim]`` (no copy) and served by torch's dense cuDNN op
``aten._scaled_dot_product_cudnn_attention``, whose cuDNN graphs torch caches per shape (so the call
costs launches only and CUDA graphs capture it, where torch 2.11's ragged path rebuilds its graph on
every call). One sequence with ``len_k > len_q`` is two dense calls merged by LSE (the non-causal
cached prefix, then the causal square of the last ``len_q`` keys); one with ``len_q > len_k`` is one
causal square over the last ``len_k`` queries, the leading ones (which see no key) output 0 and LSE
-inf. Causal dense calls are always square, so top-left and bottom-right agree.

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
"""A cuDNN attention call, ragged (:func:`cudnn_attend`) or dense (:func:`cudnn_dense_attend`): (out, lse or None)."""


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


def dense_lse(lse: torch.Tensor, batch: int, heads: int, length: int) -> torch.Tensor:
    """The dense op's logsumexp as a [batch, heads, length] view: torch 2.13 returns [batch, heads, length, 1]."""
    if lse.dim() == 4 and tuple(lse.shape) == (batch, heads, length, 1):
        return lse[..., 0]
    if lse.dim() == 3 and tuple(lse.shape) == (batch, heads, length):
        return lse
    raise RuntimeError(f"aten._scaled_dot_product_cudnn_attention returned a logsumexp of shape {list(lse.shape)}; "
                       f"the cudnn backend knows [{batch}, {heads}, {length}, 1] and [{batch}, {heads}, {length}]")


def cudnn_dense_attend(q, k, v, causal: bool, scale: float,
                       need_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One dense cuDNN attention call (top-left causal when ``causal``; the backend asks only for square ones).

    q [batch, heads, len_q, qk_dim], k [batch, heads, len_k, qk_dim], v [batch, heads, len_k, v_dim]: strided
    views of packed tensors (bf16/fp16). Returns (out [batch, heads, len_q, v_dim] in q's dtype and in q's
    memory layout, LSE [batch, heads, len_q] float32 or None).
    """
    result = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, need_lse, 0.0, causal, False,
                                                                 scale=scale)
    return result[0], (dense_lse(result[1], *q.shape[:3]) if need_lse else None)


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


def takes_dense_path(call: specs.PrefillCall, dense_available: bool) -> bool:
    """Whether :func:`run` serves ``call`` through the dense op (metadata only: no value is read)."""
    return (dense_available and call.k.shape[1] == call.q.shape[1] and call.cu_seqlens_q.shape[0] > 1
            and specs.prefill_dense_batch(call.q, call.k, call.cu_seqlens_q, call.cu_seqlens_k, call.max_seqlen_q))


def _bhsd(x: torch.Tensor, batch: int) -> torch.Tensor:
    """Packed [batch * length, heads, dim] as a [batch, heads, length, dim] view (no copy)."""
    return x.view(batch, x.shape[0] // batch, x.shape[1], x.shape[2]).transpose(1, 2)


def _packed(out: torch.Tensor) -> torch.Tensor:
    """[batch, heads, length, dim] back to a contiguous [batch * length, heads, dim]: a view when ``out`` lies
    in memory as [batch, length, heads, dim] (the dense op allocates its output in q's layout), else a copy."""
    b, h, length, d = out.shape
    return out.transpose(1, 2).reshape(b * length, h, d).contiguous()


def _packed_lse(lse: torch.Tensor) -> torch.Tensor:
    """[batch, heads, length] to a contiguous [heads, batch * length] (a view for one sequence)."""
    b, h, length = lse.shape
    return lse.transpose(0, 1).reshape(h, b * length).contiguous()


def _run_dense(call: specs.PrefillCall, q, k, v, scale: float, attend: Attend) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense path (module docstring) on codes q/k/v [tokens, heads, dim], both totals > 0."""
    batch = call.cu_seqlens_q.shape[0] - 1
    total_q, heads, _ = q.shape
    total_k, need_lse = k.shape[0], call.return_lse
    if batch > 1 or total_q == total_k or not call.causal:
        out, lse = attend(_bhsd(q, batch), _bhsd(k, batch), _bhsd(v, batch), call.causal, scale, need_lse)
        return _packed(out), (None if lse is None else _packed_lse(lse))
    if total_q > total_k:  # the first total_q - total_k queries see no key; the rest are a causal square
        blind = total_q - total_k
        part, part_lse = attend(_bhsd(q[blind:], 1), _bhsd(k, 1), _bhsd(v, 1), True, scale, need_lse)
        out = torch.zeros((total_q, heads, v.shape[2]), dtype=v.dtype, device=v.device)
        out[blind:] = _packed(part)
        lse = None
        if need_lse:
            lse = torch.full((heads, total_q), float("-inf"), dtype=torch.float32, device=q.device)
            lse[:, blind:] = _packed_lse(part_lse)
        return out, lse
    prefix = total_k - total_q  # cached keys every query sees, then the causal square of the last total_q keys
    out_a, lse_a = attend(_bhsd(q, 1), _bhsd(k[:prefix], 1), _bhsd(v[:prefix], 1), False, scale, True)
    out_b, lse_b = attend(_bhsd(q, 1), _bhsd(k[prefix:], 1), _bhsd(v[prefix:], 1), True, scale, True)
    every_row = torch.ones(total_q, dtype=torch.int8, device=q.device)
    return finish.merge(_packed(out_a), lse_a[0], every_row, _packed(out_b), lse_b[0], every_row, need_lse)


def run(call: specs.PrefillCall, config: dict, attend: Attend = cudnn_attend,
        dense_attend: Attend | None = cudnn_dense_attend) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one validated prefill call; ``attend`` / ``dense_attend`` are the ragged / dense cuDNN calls (tests
    pass emulations; ``dense_attend`` None: the dense op is absent, every batch takes the ragged path).

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

    if takes_dense_path(call, dense_attend is not None):
        out, lse = _run_dense(call, q, k, v, scale, dense_attend)
    elif call.causal and _same_lengths(call):
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
