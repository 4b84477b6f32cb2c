"""Mutants of the eager step's host-side cuts (issue 11): the fused q_a / kv_a projection, the host index read.

Each is one plausible bug the CPU tests must notice; run them with ``python3 tests/mutation/run.py --only module_host``.
"""
from __future__ import annotations

_NN = "mla_core/nn.py"
_FUSION = "tests/test_nn_host.py -k 'follows or names'"

MUTANTS = [
    dict(file=_NN,
         old='if q["weight"].data_ptr() != start or kv["weight"].data_ptr() != start + kv_weight_at:',
         new='if q["weight"].data_ptr() != start:',
         tests=[_FUSION],
         why="kv_a_proj_with_mqa's weight given storage of its own still runs the fused GEMM on stale rows"),
    dict(file=_NN,
         old='                              or kv["bias"].data_ptr() != b.data_ptr() + kv_bias_at):',
         new='                              or False):',
         tests=[_FUSION],
         why="kv_a_proj_with_mqa's bias given storage of its own still adds the fused tensor's stale bias"),
    dict(file=_NN,
         old="        if self._fused_qkv_a() is None:      # a move or a cast made new storage for each parameter\n"
             "            self._fuse_qkv_a()",
         new="        pass",
         tests=[_FUSION],
         why="after .to() / .float() the projections are never fused again (two GEMMs for the module's life)"),
    dict(file=_NN,
         old="        self.register_load_state_dict_post_hook(_fuse_after_load)",
         new="        pass",
         tests=[_FUSION],
         why="load_state_dict(assign=True) replaces the parameters: the step silently goes back to two GEMMs"),
    dict(file=_NN,
         old="            w = torch.cat([t.detach() for t in weights])",
         new="            w = torch.cat([t.detach() for t in weights[::-1]])",
         tests=[_FUSION],
         why="the fused rows in the wrong order: a re-fused q_a_proj (after a cast) gets kv_a_proj_with_mqa's values"),
    dict(file=_NN,
         old="        if fused is None or torch.compiler.is_compiling():",
         new="        if fused is None:",
         tests=["tests/test_nn_transformers.py -k torch_compile"],
         why="under torch.compile the storage check reads data pointers (no fullgraph trace)"),
    dict(file=_NN,
         old='key = (_identity(params["weight"]), _identity(params.get("weight_scale_inv")))',
         new='key = (_identity(params["weight"]), ())',
         tests=["tests/test_nn_host.py -k fp8_layer_weights"],
         why="layer_weights keyed on kv_b_proj's weight only: updated FP8 scales keep the old w_uk / w_uv scales"),
    dict(file="mla_core/layer.py",
         old="        host[i] = chunk.view(torch.int64) if w else chunk",
         new="        host[i] = chunk",
         tests=["tests/test_layer.py -k content_checks_take_any_index_dtypes"],
         why="the content checks' host read hands an int64 tensor back as its int32 words (lengths halved / zero)"),
    dict(file="mla_core/layer.py",
         old="    for i, w, chunk in zip(order, wide, chunks):",
         new="    for i, w, chunk in zip(range(len(tensors)), wide, chunks):",
         tests=["tests/test_layer.py -k content_checks_take_any_index_dtypes"],
         why="the host chunks handed back in transfer order (int64 first), not argument order"),
]
