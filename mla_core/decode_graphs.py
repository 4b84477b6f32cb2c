"""CUDA-graph replay of :class:`mla_core.nn.MLAAttention`'s eager decode step (opt-in: ``cuda_graph_decode=True``).

Per key (the step's tensor shapes and dtypes, and what the graph bakes in: the addresses and versions of the
module's parameters and buffers), the first call runs eagerly (dispatch records the eager choice), the second
checks the caller's tensors, copies them into static buffers, warms the step up on a side stream, captures it
and replays it; later calls check, copy in, replay and return a copy of the static output. docs/layer.md,
"CUDA-graph replay of the decode step".
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

DEFAULT_MAX_GRAPHS = 4
"""Keys (captured graphs or first-seen keys) one module keeps by default; the least recently used goes first."""


def _baked(t: torch.Tensor | None, versioned: bool = True) -> tuple:
    """What a graph bakes in of a tensor it reads: its object, address, shape, dtype and (``versioned``) version
    counter, which an in-place update (``load_state_dict``) bumps: tensors derived from a parameter (the layer's
    ``w_uk`` copy, the triton layer's dequantized weights) are baked in as they were at the capture. None: empty."""
    if t is None:
        return ()
    version = -1
    if versioned:
        try:
            version = t._version
        except RuntimeError:         # an inference tensor has no version counter
            pass
    return id(t), t.data_ptr(), t.shape, t.dtype, version


class _Graph:
    """One captured step: static inputs (hidden [tokens, hidden], offsets [batch + 1], table [batch, pages],
    lengths [batch]), the static output [tokens, hidden], the replay, and the q / kv stand-ins the checks take."""

    __slots__ = ("inputs", "output", "replay", "q", "kv")

    def __init__(self, inputs, output, replay, q, kv):
        self.inputs, self.output, self.replay, self.q, self.kv = inputs, output, replay, q, kv


class DecodeGraphs:
    """The decode-step graphs of one module, at most ``max_graphs`` keys (least recently used evicted).

    ``captures`` / ``replays`` count what ran (tests read them). The CUDA parts (:meth:`_capture`,
    :meth:`_on_cuda`, :meth:`_outer_capture`) are methods so CPU tests can stand in for them.
    """

    def __init__(self, max_graphs: int = DEFAULT_MAX_GRAPHS):
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_decode_graphs: got {max_graphs!r}, needs an int >= 1")
        self.max_graphs = max_graphs
        self.entries: OrderedDict[tuple, _Graph | None] = OrderedDict()
        self.baked: tuple | None = None
        self.stream = None
        self.captures = self.replays = 0

    # ---- CUDA seams

    @staticmethod
    def _on_cuda(t: torch.Tensor) -> bool:
        return t.is_cuda

    @staticmethod
    def _outer_capture(t: torch.Tensor) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def _capture(self, step: Callable[[], torch.Tensor], device) -> tuple[torch.Tensor, Callable[[], None]]:
        """Warm ``step`` up on a side stream, capture it there; (its static output, the replay)."""
        if self.stream is None or self.stream.device != device:
            self.stream = torch.cuda.Stream(device=device)
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            step()                       # the same step on the same inputs: rewrites the same cache rows
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            output = step()
        return output, graph.replay

    # ---- the step

    def key(self, module, hidden: torch.Tensor, offsets: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor,
            max_seq_len: int | None) -> tuple | None:
        """The step's key, or None when the step runs eagerly (not a one-token-per-request CUDA decode, an
        outer capture, tracing, grad enabled, tensor parallelism). Drops every graph when a baked-in tensor
        changed (a reload, ``reset_cache``, a move)."""
        if (max_seq_len != 1 or type(max_seq_len) is not int or module.tp_group is not None
                or torch.is_grad_enabled() or torch.compiler.is_compiling()
                or not self._on_cuda(hidden) or self._outer_capture(hidden)):
            return None
        tokens = hidden.shape[0]
        if tokens == 0 or hidden.dim() != 2 or offsets.dim() != 1 or offsets.shape[0] != tokens + 1:
            return None
        baked = [module.attention_backend]
        for mod in module._modules.values():
            baked.extend(_baked(p) for p in mod._parameters.values())
        baked.extend(_baked(b, versioned=False) for b in module._buffers.values())   # (the step writes the cache)
        baked = tuple(baked)
        if baked != self.baked:
            self.entries.clear()
            self.baked = baked
        return tuple((t.shape, t.dtype, t.device) for t in (hidden, offsets, table, lengths)) + (
            torch.is_inference_mode_enabled(),)

    def seen(self, key: tuple) -> None:
        """Remember a key whose first (eager) call succeeded: its next call captures."""
        self._keep(key, None)

    def _keep(self, key: tuple, entry: _Graph | None) -> None:
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_graphs:
            self.entries.popitem(last=False)

    def run(self, module, key: tuple, hidden, offsets, table, lengths) -> torch.Tensor | None:
        """The step's output [tokens, hidden] (a fresh tensor), or None when ``key`` is new (run it eagerly).

        The checks the current ``MLA_CORE_CHECKS`` mode asks for run on the caller's tensors before anything
        is copied or replayed.
        """
        if key not in self.entries:
            return None
        entry = self.entries[key]
        if entry is None:
            return self._first_capture(module, key, hidden, offsets, table, lengths)
        module._check_decode(entry.q, entry.kv, offsets, table, lengths)
        for static, given in zip(entry.inputs, (hidden, offsets, table, lengths)):
            static.copy_(given)
        entry.replay()
        self.replays += 1
        self.entries.move_to_end(key)
        return entry.output.clone()

    def _first_capture(self, module, key, hidden, offsets, table, lengths) -> torch.Tensor:
        tokens, device = hidden.shape[0], hidden.device
        dtype = module.latent_cache.dtype
        q = torch.empty(tokens, module.local_heads, module.qk_dim, dtype=dtype, device=device)
        kv = torch.empty(tokens, module.kv_lora_rank + module.rope_dim, dtype=dtype, device=device)
        module._check_decode(q, kv, offsets, table, lengths)
        inputs = tuple(t.clone(memory_format=torch.contiguous_format) for t in (hidden, offsets, table, lengths))
        with torch.no_grad():
            output, replay = self._capture(lambda: module._step(*inputs, max_seq_len=1), device)
        entry = _Graph(inputs, output, replay, q, kv)
        self.captures += 1
        self._keep(key, entry)
        entry.replay()
        self.replays += 1
        return entry.output.clone()
