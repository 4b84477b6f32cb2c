"""Every rule the reference defines, at its exact edges, on every backend that implements it (reference and
triton; the triton kernels run under the interpreter on the CPU).

- Tile edges by construction (mla_core.testing.shapes): decode lengths at multiples of the 32-key P tile and
  of the split schedule (a kernel counting ``L // 32 + 1`` tiles moves the split boundaries: visible with a
  quantized P); causal prefill pairs whose query tile's last visible key is the first key of a key tile (a
  kernel ending its key loop one key early skips that tile).
- N:M sparsity: ties keep the lower index; the dense sink and recent-window rules at their exact edges.
Every case is also checked against the independent float64 math of tests/reference_math.py.
"""
from __future__ import annotations

import os

import pytest
import torch

import mla_core
from mla_core.testing.shapes import boundary_lengths, causal_boundary_pairs, split_boundary_lengths
from paged_inputs import paged_decode_inputs
from reference_math import decode_math, prefill_math, rel_l2, same_lse

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["reference", pytest.param("triton", marks=pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()), reason="triton runs under the interpreter or on a GPU"))]
FP32_TOL = 1e-5
NAN = float("nan")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every buffer the triton decode / prefill kernels write starts as NaN (an unwritten element fails)."""
    if not (INTERPRETED or torch.cuda.is_available()):
        return
    from mla_core_triton import decode, prefill
    for module in (decode, prefill):
        monkeypatch.setattr(module, "_new_output",
                            lambda shape, dtype, device: torch.full(shape, NAN, dtype=dtype, device=device))


# ------------------------------------------------------------------------------------------------ decode


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("splits", [2, 3])
def test_decode_lengths_at_tile_and_split_edges(backend, splits):
    """Lengths at k*32 - 1, k*32, k*32 + 1 and at the split schedule's edges, NVFP4 K / V / P (with a
    quantized P the split boundaries change the numbers), against the float64 math."""
    lengths = split_boundary_lengths(splits, limit=7 * 32 + 1)
    q, cache, table, lens = paged_decode_inputs(lengths, 2, 48, 16, torch.float16, seed=splits)
    kw = dict(k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4")
    out, lse = mla_core.mla_decode(q, cache, table, lens, softmax_scale=0.3, kv_lora_rank=32, qk_rope_head_dim=16,
                                   num_kv_splits=splits, out_dtype=torch.float32, backend=backend, **kw)
    ref, ref_lse = decode_math(q, cache, table, lens, softmax_scale=0.3, kv_lora_rank=32, num_kv_splits=splits,
                               **kw)
    assert rel_l2(out, ref) < FP32_TOL and same_lse(lse, ref_lse, 1e-4)
    assert (out[lens == 0] == 0).all() and (lse[lens == 0] == float("-inf")).all()


# ------------------------------------------------------------------------------------------------ prefill


def _prefill_inputs(seqs, heads=1, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(total_q, heads, dim, generator=g)
    k = torch.randn(total_k, 1, dim, generator=g)
    v = torch.randn(total_k, 1, dim, generator=g)
    cu_q = torch.tensor([0] + [sum(s[0] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(s[1] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    return q, k, v, cu_q, cu_k, max(s[0] for s in seqs)


def _check_prefill(backend, inputs, causal, **kw):
    """The backend (triton: each of its CPU configs, BLOCK_M 32 and 16) against the float64 math."""
    q, k, v, cu_q, cu_k, max_q = inputs
    ref, ref_lse = prefill_math(q, k, v, cu_q, cu_k, softmax_scale=q.shape[-1] ** -0.5, causal=causal,
                                **{n: x for n, x in kw.items() if n != "block_m"})
    out, lse = mla_core.mla_prefill(q, k, v, cu_q, cu_k, max_q, causal=causal, return_lse=True, backend=backend,
                                    **kw)
    results = [(out, lse, "dispatched")]
    if backend == "triton":
        from mla_core_triton import prefill
        problem, call = mla_core.specs.validate_prefill(
            q, k, v, cu_q, cu_k, max_q, None, causal, True, q_quant=None, k_quant=None, p_quant=None, v_quant=None,
            q_amax=None, k_amax=None, p_amax=1.0, v_amax=None, **{"sparsity_n": 0, "sparsity_m": 4,
                                                                  "dense_sink_tokens": 0, "dense_recent_tokens": 64,
                                                                  "block_m": 64, **kw})
        results += [(*prefill.run(call, config), config) for config in prefill.configs(problem)]
    for o, l, how in results:
        assert rel_l2(o, ref) < FP32_TOL and same_lse(l, ref_lse, 1e-4), how
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 16), (32, 32), (16, 32)])
def test_prefill_causal_query_tile_ends_on_a_key_tile(backend, block_m, block_n):
    """(len_q, len_k) from causal_boundary_pairs for the CPU configs' query tiles (BLOCK_M 32 and 16) and the
    key tile block_n, plus the audit's 64 / 65 at block_n 16: each puts a full query tile's last visible key
    on the first key of a key tile, which a kernel ending its loop at ``hi - 1`` skips. Triton runs every
    CPU config (BLOCK_M 32 and 16) on each."""
    seqs = list(causal_boundary_pairs(block_m, block_n, limit=130)) + [(64, 65)]
    _check_prefill(backend, _prefill_inputs(seqs, seed=block_m + block_n), True, block_n=block_n, block_m=block_m)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_lengths_at_tile_edges(backend, causal):
    """Every boundary length of the 16/32-row and 16/32-key tiles as len_q == len_k, and len_q < len_k."""
    lengths = boundary_lengths([16, 32], limit=65)
    seqs = [(n, n) for n in lengths] + [(n, n + 17) for n in lengths]
    _check_prefill(backend, _prefill_inputs(seqs, seed=int(causal)), causal, block_n=16)


def _designed_scores(scores, rows, dim=16):
    """q / k / v whose score for key j is ``scores[j]`` for every query row (q = e_0, k_j = scores[j] * sqrt(dim)
    * e_0, so q·k * dim^-0.5 = scores[j]) and distinct random values."""
    g = torch.Generator().manual_seed(len(scores))
    q = torch.zeros(rows, 1, dim)
    q[:, 0, 0] = 1.0
    k = torch.zeros(len(scores), 1, dim)
    k[:, 0, 0] = torch.tensor(scores) * dim ** 0.5
    v = torch.randn(len(scores), 1, dim, generator=g)
    return q, k, v


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,m,pattern", [(1, 4, [1.0, 2.0, 2.0, 1.0]), (2, 4, [2.0, 1.0, 0.0, 1.0]),
                                         (3, 8, [1.0, 3.0, 1.0, 0.0, 2.0, 1.0, 0.5, 1.0])])
def test_nm_ties_keep_the_lower_index(backend, n, m, pattern):
    """Every group's N-th and (N+1)-th largest scores tie (at different positions, with different V): the
    earlier are kept. Keeping the later ones changes the output by O(1)."""
    scores = (pattern * 6)[:m * 5 + 2]                       # a partial last group too
    q, k, v = _designed_scores(scores, rows=3)
    inputs = q, k, v, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, len(scores)], dtype=torch.int32), 3
    kw = dict(sparsity_n=n, sparsity_m=m, dense_sink_tokens=0, dense_recent_tokens=0, block_n=16)
    out = _check_prefill(backend, inputs, False, **kw)
    later = [j for g0 in range(0, len(scores), m)
             for j in sorted(range(g0, min(g0 + m, len(scores))), key=lambda j: (-scores[j], -j))[:n]]
    s = torch.full((len(scores),), float("-inf"))
    s[later] = torch.tensor(scores)[later]
    wrong = (torch.softmax(s, 0)[:, None] * v[:, 0]).sum(0)
    assert rel_l2(out[0, 0], wrong) > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sinks,recent", [(3, 0), (6, 0), (0, 5), (0, 6), (2, 7), (7, 3)])
def test_nm_dense_sinks_and_recent_window_at_their_edges(backend, sinks, recent):
    """2:4 where positions 2 and 3 of every group always lose (scores 3, 2, 1, 0 per group), so only the dense
    rules keep them: the sink rule exactly at ``kv_pos < sinks`` (position ``sinks - 1`` kept, ``sinks`` not)
    and the recent rule exactly at ``0 <= q_pos - kv_pos < recent``; query rows at every offset put the
    window's edge on every group position. Compared with the float64 math, and with an off-by-one rule."""
    len_k, len_q = 40, 24
    scores = [3.0 - (j % 4) for j in range(len_k)]
    q, k, v = _designed_scores(scores, rows=len_q)
    inputs = q, k, v, torch.tensor([0, len_q], dtype=torch.int32), torch.tensor([0, len_k], dtype=torch.int32), len_q
    kw = dict(sparsity_n=2, sparsity_m=4, dense_sink_tokens=sinks, dense_recent_tokens=recent, block_n=16)
    out = _check_prefill(backend, inputs, True, **kw)
    # one more sink matters when key `sinks` loses its group (positions 2, 3); one more recent key always
    # does for some row (every row's edge key lands on every group position)
    off_by_ones = [dict(dense_recent_tokens=recent + 1)] + ([dict(dense_sink_tokens=sinks + 1)] if sinks % 4 >= 2 else [])
    for off_by_one in off_by_ones:
        wrong, _ = prefill_math(q, k, v, inputs[3], inputs[4], softmax_scale=0.25, causal=True, **{**kw, **off_by_one})
        assert rel_l2(out, wrong) > 1e-3, off_by_one
