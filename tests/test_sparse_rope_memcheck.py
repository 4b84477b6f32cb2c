"""RoPE + FP8 and FP8 sparse decode never read outside their tensors: compute-sanitizer memcheck on the GPU.

Under ``MLA_CORE_CHECKS=metadata`` (the serving mode: no content checks), with positions outside the cos/sin
table, sparse indices past the cache, negative indices other than -1, lengths past top-k, on both cache layouts
and with every tensor its own exact-size allocation (no caching allocator), every backend implementing the ops
runs under ``compute-sanitizer --tool memcheck`` with 0 errors and finite outputs.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

MEMCHECK_SCRIPT = r'''
import os
os.environ["MLA_CORE_CHECKS"] = "metadata"
import torch
import mla_core
from mla_core import inputs, layouts

dev = "cuda"
for backend in ("musa_fp8", "reference"):
    rk = inputs.rope_inputs(7, heads=4, max_pos=16, device=dev, seed=1)
    rk["pos_ids"] = torch.tensor([0, -1, 15, 16, 10 ** 6, 2 ** 31 - 1, -(2 ** 31)], device=dev)
    for neox in (True, False):
        outs = mla_core.mla_rope_quantize_fp8(**rk, is_neox=neox, backend=backend)
        torch.cuda.synchronize()
        assert all(torch.isfinite(o.float()).all() for o in outs)
    for layout in ("fp8", "fp8_ds_mla"):
        batch, q_len, heads, top_k, rows = 2, 2, 16, 64, 32
        width = 576 if layout == "fp8" else 656
        if layout == "fp8":
            query = torch.randn(batch, q_len, heads, 576, device=dev).to(torch.float8_e4m3fn)
            cache = torch.randn(rows, 576, device=dev).to(torch.float8_e4m3fn).view(2, 16, 576)
        else:
            query = torch.randn(batch, q_len, heads, 576, device=dev, dtype=torch.bfloat16)
            cache = layouts.pack_fp8_ds_mla(torch.randn(rows, 576)).to(dev).view(2, 16, width)
        idx = torch.randint(0, rows, (batch, q_len, top_k), device=dev, dtype=torch.int32)
        idx[0, :, ::5] = rows            # just past the cache
        idx[0, :, 1::7] = 2 ** 31 - 1
        idx[1, :, ::3] = -7              # negative, not -1
        idx[1, :, 2::9] = -1
        lens = torch.tensor([top_k, 40], dtype=torch.int32, device=dev)
        out, lse = mla_core.sparse_mla_fp8_decode(query, cache, None, 128, 512, 64, idx, lens, 0, top_k,
                                                  bmm1_scale=576 ** -0.5, backend=backend, return_lse=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all()
print("memcheck script done")
'''


@pytest.mark.gpu
def test_rope_and_sparse_decode_out_of_range_under_compute_sanitizer(tmp_path):
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    assert os.path.exists(tool), "compute-sanitizer not found (CUDA toolkit's bin/)"
    assert torch.cuda.is_available()
    script = tmp_path / "memcheck_sparse_rope.py"
    script.write_text(MEMCHECK_SCRIPT)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    r = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script)],
                       capture_output=True, text=True, env=env, timeout=600)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0 and "memcheck script done" in r.stdout and "ERROR SUMMARY: 0 errors" in r.stdout
