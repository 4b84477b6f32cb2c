"""mla_core's Triton backend (CUDA; the CPU through ``TRITON_INTERPRET=1``)."""
