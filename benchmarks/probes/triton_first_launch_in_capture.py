"""Probe (GPU): can a CUDA-graph capture be the first call of a Triton decode kernel in a process?

Why dispatch lets a capture of a problem already called eagerly take the eager choice (mla_core/dispatch.py):
Triton loads a kernel's module (``cuModuleLoadData``) at its first launch, which some stacks refuse inside a capture
("operation not permitted when stream is capturing"); on the H200 with torch 2.11 / triton 3.6 it printed ok. Run in
a fresh process (nothing launched before): captures ``mla_decode(backend="triton")`` at 16 heads, batch 1, auto
splits, as the first call, then prints one line ``first Triton launch inside a capture: ok`` or ``... failed:
<error>``. Exit status 0 either way (a probe, not a test).

    python3 benchmarks/probes/triton_first_launch_in_capture.py
"""
import torch

import mla_core
from mla_core.inputs import decode_inputs


def main() -> None:
    args = decode_inputs([3000], heads=16, page_size=64, device="cuda", seed=3)
    torch.cuda.synchronize()
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.graph(graph, stream=stream):
            mla_core.mla_decode(**args, num_kv_splits="auto", backend="triton")
        graph.replay()
        torch.cuda.synchronize()
        print("first Triton launch inside a capture: ok")
    except Exception as exc:  # noqa: BLE001 (the probe's answer)
        print(f"first Triton launch inside a capture: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


if __name__ == "__main__":
    main()
