"""Mutants of the eager step's host-side cuts (issue 11): layer_weights' key, the content checks' host index read.

Each is one plausible bug the CPU tests must notice; run them with ``python3 tests/mutation/run.py --only module_host``.
"""
from __future__ import annotations

_NN = "mla_core/nn.py"

MUTANTS = [
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
