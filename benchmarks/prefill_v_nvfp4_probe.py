"""Probe of the bf16 prefill with NVFP4 V and a calibrated v_amax on the GPU (see NOTES, prefill).

    python benchmarks/prefill_v_nvfp4_probe.py

Relative L2 error of the triton prefill against the reference for V-only NVFP4 in bf16, per config
(pre-pass on/off), per amax (None, max|v|, a power-of-two global scale), and where in the output the
error sits (query rows, output columns).
"""
import torch

import mla_core
from mla_core import specs
from mla_core.accuracy import rel_l2
from mla_core_triton import prefill

n, h = 1024, 16
g = torch.Generator(device="cuda").manual_seed(0)
cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
q, k = (torch.randn(n, h, 192, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
v = torch.randn(n, h, 128, device="cuda", generator=g).to(torch.bfloat16)
vmax = float(v.abs().max())
for amax in (None, vmax, 5.25, 2 * vmax):
    for causal in (True, False):
        problem, call = specs.validate_prefill(q, k, v, cu, cu, n, None, causal, False, q_quant=None, k_quant=None,
                                               p_quant=None, v_quant="nvfp4", q_amax=None, k_amax=None, p_amax=1.0,
                                               v_amax=amax, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
                                               dense_recent_tokens=64, block_m=64, block_n=64)
        ref = mla_core.get_backend("reference").run(problem, call, {})[0].float()
        for cfg in ({"BLOCK_M": 64, "num_warps": 4, "num_stages": 2, "kv_prepass": True},
                    {"BLOCK_M": 64, "num_warps": 4, "num_stages": 2, "kv_prepass": False}):
            out = prefill.run(call, cfg)[0].float()
            err = (out - ref).norm(dim=(1,)) / ref.norm(dim=(1,))  # per (row, head)
            rows = err.mean(dim=1)
            cols = ((out - ref).norm(dim=(0, 1)) / ref.norm(dim=(0, 1)))
            print(f"amax={amax} causal={causal} prepass={cfg['kv_prepass']}: rel {rel_l2(out, ref):.2e}; rows 0-63 "
                  f"{rows[:64].mean():.1e}, 64-511 {rows[64:512].mean():.1e}, 512+ {rows[512:].mean():.1e}; "
                  f"worst cols {cols.topk(3).indices.tolist()} {cols.topk(3).values.tolist()}", flush=True)
# the V codes themselves: dequantized values of the pre-pass against numerics.qdq_nvfp4 along keys
for amax in (vmax, None):
    fmt_f = mla_core.numerics.nvfp4_global_scale(amax)
    codes = prefill._prepass_v(v, cu, 1, 2, fmt_f, prefill._hw_mode(True, [(2, fmt_f)]), torch.bfloat16)
    mine = codes.float() * fmt_f
    want = mla_core.numerics.qdq_nvfp4(v, amax, dim=0)
    bad = (mine != want) & ((mine - want).abs() > 1e-6 * want.abs().clamp_min(1e-30))
    print(f"v codes amax={amax}: {int(bad.sum())} of {bad.numel()} differ; rel {rel_l2(mine, want):.2e}")
    if bad.any():
        i = bad.nonzero()[0].tolist()
        print("  first:", i, float(v[tuple(i)]), float(mine[tuple(i)]), float(want[tuple(i)]))
