"""Which failing checks of a torch C++ extension reach Python as RuntimeError and which kill the process? (round q:
`binding_errors.py` showed mla_core_cuda's prefill_wgmma raising on a TORCH_CHECK with a literal message but dying
with SIGSEGV on one whose message formats numbers.) A one-file extension built here (load_inline, the compiler the
CUDA build uses) with one function per way of failing; each is called in a subprocess of its own.
    python3 benchmarks/probes/torch_check_abi.py [build_dir]"""
import os
import subprocess
import sys
import tempfile

SOURCE = r"""
#include <stdexcept>
#include <string>
void check_literal() { TORCH_CHECK(false, "a literal message"); }
void check_int() { TORCH_CHECK(false, "a number ", int64_t{3}); }
void check_string() { TORCH_CHECK(false, std::string("a std::string message")); }
void check_strides(const at::Tensor& t) { TORCH_CHECK(false, "strides ", t.strides()); }
void std_runtime() { throw std::runtime_error("std::runtime_error " + std::to_string(3)); }
std::string str_only() { return c10::str("c10::str ", int64_t{3}); }
void value_error() { throw pybind11::value_error("pybind11::value_error " + std::to_string(3)); }
"""
FUNCTIONS = ["check_literal", "check_int", "check_string", "check_strides", "std_runtime", "str_only", "value_error"]


def build(directory):
    from torch.utils import cpp_extension
    return cpp_extension.load_inline("torch_check_abi", cpp_sources=SOURCE, functions=FUNCTIONS,
                                     build_directory=directory, extra_cflags=["-O3"], verbose=False)


if __name__ == "__main__":
    import torch
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    os.makedirs(directory, exist_ok=True)
    build(directory)
    print("torch", torch.__version__, "cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI,
          subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[0])
    crashed = 0
    for name in FUNCTIONS:
        call = f"m.{name}(torch.zeros(2, 3))" if name == "check_strides" else f"m.{name}()"
        code = (f"import sys, torch; sys.path.insert(0, {directory!r}); import torch_check_abi as m\n"
                f"try:\n    r = {call}\nexcept Exception as e:\n    print(type(e).__name__, str(e).splitlines()[0][:100])\n"
                f"else:\n    print('returned', repr(r))\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"{name:14s} rc {r.returncode:4d}  {last}")
        crashed += r.returncode != 0
    print(f"{crashed} of {len(FUNCTIONS)} crashed")
