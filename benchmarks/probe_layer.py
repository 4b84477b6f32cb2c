"""One-off probe for issue 11 (round 2): torch._scaled_mm block-wise scaling on this GPU, and where the eager
decode call of mla_forward spends its time (torch.profiler, host time with and without content checks)."""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import torch.nn.functional as F

def scaled_mm_probe():
    dev = "cuda"
    M, K, N = 256, 512, 1024
    a = (torch.randn(M, K, device=dev) * 8).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K, device=dev) * 8).to(torch.float8_e4m3fn)          # weight [N, K]
    sa = torch.rand(M, K // 128, device=dev) + 0.5                            # 1x128
    sb = torch.rand(N // 128, K // 128, device=dev) + 0.5                     # 128x128
    ref = (a.float() * sa.repeat_interleave(128, 1)) @ (b.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)).T
    ST = getattr(F, "ScalingType", None)
    tries = {
        "v1 1x128 x 128x128 (sa col-major, sb [N/128,K/128]^T)": lambda: torch._scaled_mm(
            a, b.T, sa.T.contiguous().T, sb.T, out_dtype=torch.bfloat16),
        "v1 1x128 x 128x128 (sa row-major)": lambda: torch._scaled_mm(a, b.T, sa, sb.T, out_dtype=torch.bfloat16),
        "v1 1x128 x 128x128 (sb contiguous [K/128,N/128])": lambda: torch._scaled_mm(
            a, b.T, sa.T.contiguous().T, sb.T.contiguous(), out_dtype=torch.bfloat16),
        "v1 rowwise": lambda: torch._scaled_mm(a, b.T, sa[:, :1].contiguous(), sb[:, :1].repeat_interleave(128, 0).T.contiguous(),
                                               out_dtype=torch.bfloat16),
    }
    if ST is not None:
        tries["F.scaled_mm 1x128 x 128x128"] = lambda: F.scaled_mm(a, b.T, sa.T.contiguous().T, ST.BlockWise1x128,
                                                                    sb.T, ST.BlockWise128x128)
        tries["F.scaled_mm 128x128 x 128x128"] = lambda: F.scaled_mm(
            a, b.T, sa[::128].contiguous() if False else torch.rand(M // 128, K // 128, device=dev), ST.BlockWise128x128,
            sb.T, ST.BlockWise128x128)
    for name, fn in tries.items():
        try:
            out = fn().float()
            err = ((out - ref).norm() / ref.norm()).item()
            print(f"scaled_mm {name}: ok, rel L2 vs float32 reference {err:.2e}" + ("" if "rowwise" not in name else " (scales differ: shape check only)"))
        except Exception as e:
            print(f"scaled_mm {name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

def host_probe():
    import mla_core
    from bench_layer import layer_inputs
    for heads, batch in ((16, 1), (128, 32)):
        a = layer_inputs(heads, batch, 8192, 1, "cuda")
        for mode in ("full", "metadata"):
            os.environ["MLA_CORE_CHECKS"] = mode
            for _ in range(3):
                mla_core.mla_forward(**a)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(20):
                mla_core.mla_forward(**a)
            host = (time.perf_counter() - t) / 20 * 1e6
            torch.cuda.synchronize()
            total = (time.perf_counter() - t) / 20 * 1e6
            print(f"H{heads} B{batch} checks={mode}: host {host:.0f} us/call, with the final sync {total:.0f} us/call")
        os.environ["MLA_CORE_CHECKS"] = "full"
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                mla_core.mla_forward(**a)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
    os.environ.pop("MLA_CORE_CHECKS")

if __name__ == "__main__":
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
    scaled_mm_probe()
    host_probe()
