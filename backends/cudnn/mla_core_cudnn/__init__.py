"""mla_core's cuDNN backend: ``mla_prefill`` through cuDNN's fused attention as torch exposes it (no build)."""
