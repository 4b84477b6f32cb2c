"""Does a refused call into the CUDA extension raise RuntimeError, or crash the process? (round q: the nv3wg branch's
test of its binding's refusal died with SIGSEGV.) Each case runs in a subprocess of its own; prints its exit code
and the error's first line. Run on a GPU machine after `mla-core build`:  python3 benchmarks/probes/binding_errors.py"""
import subprocess
import sys

CASES = {
    # a CPU tensor where the binding wants CUDA: the first TORCH_CHECK of prefill_wgmma
    "prefill_wgmma cpu q": "t = torch.zeros(4, 1, 192, dtype=torch.bfloat16); v = torch.zeros(4, 1, 128, dtype=torch.bfloat16)\n"
                           "cu = torch.tensor([0, 4], dtype=torch.int32)\n"
                           "m.prefill_wgmma(t, t, v, cu, cu, 4, v.clone(), None, True, 0.1, 1.0, 0, 1.0, 1.0, 0, 1.0, 1.0)",
    # CUDA tensors, p_fmt 9: prefill_wgmma_supported refuses
    "prefill_wgmma p_fmt 9": "d = 'cuda'; t = torch.zeros(4, 1, 192, dtype=torch.bfloat16, device=d)\n"
                             "v = torch.zeros(4, 1, 128, dtype=torch.bfloat16, device=d)\n"
                             "cu = torch.tensor([0, 4], dtype=torch.int32, device=d)\n"
                             "m.prefill_wgmma(t, t, v, cu, cu, 4, v.clone(), None, True, 0.1, 1.0, 9, 1.0, 1.0, 0, 1.0, 1.0)",
    # a TORCH_CHECK thrown and caught inside torch itself (control: torch's own translator)
    "torch control": "torch.zeros(2, device='cuda').view(3)",
    # a plain Python exception from pybind11's argument conversion (no C++ throw)
    "prefill_wgmma bad arity": "m.prefill_wgmma(1, 2)",
}
PRELUDE = "import torch\nfrom mla_core_cuda import build\nm = build.build()\n"
failed = 0
for name, body in CASES.items():
    code = PRELUDE + "try:\n" + "".join("    " + line + "\n" for line in body.splitlines()) + \
        "except (RuntimeError, TypeError, ValueError) as e:\n    print(type(e).__name__, str(e).splitlines()[0][:160])\n" \
        "else:\n    print('no error raised')\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or ["(no output)"])[-1]
    print(f"{name:26s} rc {r.returncode:4d}  {last}")
    failed += r.returncode != 0
print(f"{failed} case(s) crashed or failed")
sys.exit(1 if failed else 0)
