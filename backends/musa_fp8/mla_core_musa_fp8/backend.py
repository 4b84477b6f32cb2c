"""The musa_fp8 backend object. No kernels yet: it declares no ops."""
from __future__ import annotations

import mla_core


class MusaFp8Backend(mla_core.Backend):
    name = "musa_fp8"
    version = "0"
    priority = 150
    device_types = frozenset({"cuda", "musa"})
    description = "FP8 sparse MLA in MATE's layout (rope+quantize, top-k sparse decode); no ops implemented yet"
    capabilities = {}
