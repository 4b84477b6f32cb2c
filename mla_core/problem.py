"""``Problem``: the small hashable key of one op call, used for dispatch, capability checks and the cache."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

OPS = ("decode", "prefill", "merge", "rope_quantize_fp8", "sparse_decode", "layer")
"""Op names, as backends declare capabilities for them and as they appear in cache keys."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Problem:
    """One op call reduced to what decides which backend and config can run it and how fast.

    ``op`` is one of :data:`OPS`; ``device`` is the device type (``"cpu"``, ``"cuda"``); ``params`` holds
    named values (dims, dtype names, quant formats, page size, split count, and the batch / length
    *buckets*, powers of two) as a sorted tuple so the key is hashable; ``features`` names optional
    behaviours the call needs (``"lse"``, ``"nm_sparsity"``, ``"fp32_q"``, ``"causal"``, ...).
    Backends read values with ``problem["heads"]`` or ``problem.get("page_size")``.
    """

    op: str
    device: str
    params: tuple[tuple[str, Any], ...]
    features: frozenset[str] = field(default_factory=frozenset)

    def __hash__(self) -> int:
        # the generated hash's value (the fields' tuple), computed once per instance: dispatch hashes each op's
        # problem twice per call (its memory and the capture memory), a Python frame and ~15 tuple hashes each
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.device, self.params, self.features))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self):
        # the fields only: a pickled hash would be stale in a process with another string-hash seed
        return type(self), (self.op, self.device, self.params, self.features)

    @classmethod
    def make(cls, op: str, device: str, features=(), **params: Any) -> "Problem":
        return cls(op, device, tuple(sorted(params.items())), frozenset(features))

    def __getitem__(self, key: str) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "device": self.device, **dict(self.params), "features": sorted(self.features)}

    def key(self) -> str:
        """Stable string form, used as the autotune cache key."""
        parts = [self.op, self.device] + [f"{k}={v}" for k, v in self.params]
        if self.features:
            parts.append("features=" + "+".join(sorted(self.features)))
        return "|".join(parts)

    @classmethod
    def from_key(cls, key: str) -> "Problem":
        """Inverse of :meth:`key` (values parsed back to int where they are integers)."""
        op, device, *rest = key.split("|")
        params, features = {}, frozenset()
        for part in rest:
            k, _, v = part.partition("=")
            if k == "features":
                features = frozenset(v.split("+")) if v else frozenset()
                continue
            params[k] = int(v) if v.lstrip("-").isdigit() else (None if v == "None" else v)
        return cls.make(op, device, features, **params)

    def describe(self) -> str:
        return f"{self.op} problem on {self.device} ({', '.join(f'{k}={v}' for k, v in self.params)}" + (
            f"; needs {', '.join(sorted(self.features))})" if self.features else ")")
