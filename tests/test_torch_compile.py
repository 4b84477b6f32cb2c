"""torch.compile(fullgraph=True) traces around every public op (torch.ops.mla_core.*), and CUDA graphs capture them."""
import pytest
import torch

import mla_core
from mla_core import inputs
from mla_core.accuracy import rel_l2

REF = "reference"


def _compiled(fn):
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_decode_compiles_fullgraph_and_matches_eager():
    args = inputs.decode_inputs([5, 40, 0], heads=4, page_size=16, kv_lora_rank=32, rope_dim=16,
                                 dtype=torch.float32, seed=3)
    tensors = {k: args.pop(k) for k in ("q", "latent_cache", "block_table", "b_seq_len")}

    def step(q, latent_cache, block_table, b_seq_len):
        out, lse = mla_core.mla_decode(q, latent_cache, block_table, b_seq_len, **args, p_qdq="nvfp4",
                                       num_kv_splits=4, backend=REF)
        return out * 2, lse

    got_out, got_lse = _compiled(step)(**tensors)
    ref_out, ref_lse = step(**tensors)
    assert rel_l2(got_out, ref_out) == 0 and rel_l2(got_lse, ref_lse) == 0


def test_prefill_and_merge_compile_fullgraph():
    args = inputs.prefill_inputs([7, 0, 19], [12, 3, 19], heads=2, qk_dim=16, v_dim=8, dtype=torch.float32, seed=4)

    def step(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q):
        o1, l1 = mla_core.mla_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal=False,
                                      return_lse=True, v_quant="fp8", backend=REF)
        o2 = mla_core.mla_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal=True, backend=REF)
        lse2 = torch.zeros_like(l1)
        return mla_core.merge_attn_states(o1, l1, o2, lse2, backend=REF)

    got = _compiled(step)(**args)
    ref = step(**args)
    assert all(rel_l2(g, r) == 0 for g, r in zip(got, ref))


def test_rope_quantize_and_sparse_decode_compile_fullgraph_and_fill_buffers():
    rope = inputs.rope_inputs(9, heads=2, nope_dim=32, seed=5)
    out_buf = torch.empty(9, 2, 32, dtype=torch.float8_e4m3fn)

    def rope_step(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids):
        return mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=False,
                                              quant_scale_q=0.5, q_nope_out=out_buf, backend=REF)

    got = _compiled(rope_step)(**rope)
    ref = rope_step(**rope)
    assert all(torch.equal(g.float(), r.float()) for g, r in zip(got, ref))
    assert torch.equal(out_buf.float(), ref[2].float())

    sparse = inputs.sparse_decode_inputs(2, q_len=1, heads=4, top_k=64, num_pages=2, page_size=16, seed=6)

    def sparse_step(query, kv_cache, block_tables, seq_lens):
        return mla_core.sparse_mla_fp8_decode(query, kv_cache, None, 128, 512, 64, block_tables, seq_lens, 0,
                                              sparse_mla_top_k=64, bmm1_scale=sparse["bmm1_scale"], return_lse=True)

    tensors = {k: sparse[k] for k in ("query", "kv_cache", "block_tables", "seq_lens")}
    got = _compiled(sparse_step)(**tensors)
    ref = sparse_step(**tensors)
    assert all(rel_l2(g, r) == 0 for g, r in zip(got, ref))


def test_bad_input_under_compile_is_still_an_mla_input_error():
    args = inputs.merge_inputs(4, heads=2, head_dim=8, dtype=torch.float32)
    args["suffix_lse"] = args["suffix_lse"][:1]
    with pytest.raises(Exception, match="suffix_lse: got shape"):
        _compiled(lambda **kw: mla_core.merge_attn_states(**kw, backend=REF))(**args)
    dec = inputs.decode_inputs([5], heads=2, page_size=16, kv_lora_rank=32, rope_dim=16, dtype=torch.float32)
    with pytest.raises(Exception, match="page_size: got 8"):
        _compiled(lambda **kw: mla_core.mla_decode(**kw, page_size=8, backend=REF))(**dec)


@pytest.mark.gpu
def test_decode_captures_into_a_cuda_graph():
    args = inputs.decode_inputs([100, 3000, 1], heads=16, device="cuda", seed=7)
    eager, _ = mla_core.mla_decode(**args)
    static = torch.empty_like(eager)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mla_core.mla_decode(**args)  # warm-up: compile kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = mla_core.mla_decode(**args)
        static.copy_(out)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_l2(static, eager) == 0
