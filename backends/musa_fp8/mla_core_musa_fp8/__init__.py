"""mla_core's MUSA-style FP8 sparse backend: MATE's 576-byte FP8 rows, top-k sparse decode, reusable metadata."""
