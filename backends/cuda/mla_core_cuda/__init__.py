"""mla_core's CUDA C++ backend: Python side of the kernels in csrc/ (built with ninja on first use)."""
