"""The cuDNN backend object: what the installed torch and cuDNN offer, and why a problem cannot run.

torch exposes cuDNN's fused attention with ragged (cumulative-offset) batches as the private op
``aten._cudnn_attention_forward``, and over dense ``[batch, heads, length, dim]`` views as
``aten._scaled_dot_product_cudnn_attention`` (what SDPA's cuDNN backend calls); private ops change
between torch releases, so both signatures are probed, never assumed: a mismatch of the ragged op
makes the backend unavailable, one of the dense op only turns its dense path off, each with the
reason. Nothing here touches the GPU at import: the probes run the first time the backend is asked
about a problem.
"""
from __future__ import annotations

import importlib
import importlib.util

import mla_core
from mla_core import OpCapability

OP_NAME = "aten._cudnn_attention_forward"
OP_ARGUMENTS = ("query", "key", "value", "attn_bias", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
                "compute_log_sumexp", "dropout_p", "is_causal", "return_debug_mask")
"""The leading arguments the backend passes by position, in this order (torch 2.11..2.13); ``scale`` is keyword."""
DENSE_OP_NAME = "aten._scaled_dot_product_cudnn_attention"
DENSE_OP_ARGUMENTS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal",
                      "return_debug_mask")
"""The leading arguments the dense path passes by position (torch 2.11..2.13); ``scale`` is keyword."""
MIN_CUDNN = 90000
"""cuDNN 9.0: the oldest release whose fused attention the backend has been written against (ragged offsets,
head dims up to 256); measured with 9.19."""
MIN_CAPABILITY = (8, 0)
"""cuDNN's fused flash attention runs on sm80 (Ampere) and newer."""
MAX_HEAD_DIM = 256
OFFSET_LIMIT = 2 ** 31
"""torch hands cuDNN its ragged offsets (token offset x token stride) as int32."""
_QKV_FORMATS = frozenset({None, "fp8", "nvfp4"})


def _probe_schema(attribute: str, name: str, arguments: tuple[str, ...]) -> str | None:
    """Why ``torch.ops.aten.<attribute>`` cannot be called with ``arguments`` by position (then ``scale=``)
    returning (output, logsumexp, ...), or None."""
    import torch
    try:
        schema = getattr(torch.ops.aten, attribute).default._schema
    except (AttributeError, RuntimeError) as e:
        return f"torch {torch.__version__} has no {name} ({type(e).__name__})"
    names = tuple(a.name for a in schema.arguments)
    if names[:len(arguments)] != arguments or "scale" not in names:
        return (f"{name} in torch {torch.__version__} takes ({', '.join(names)}); this backend was written for "
                f"({', '.join(arguments)}, *, scale)")
    if len(schema.returns) < 2:
        return f"{name} in torch {torch.__version__} returns {len(schema.returns)} values, needs (output, logsumexp, ...)"
    return None


def probe_op() -> str | None:
    """Why ``aten._cudnn_attention_forward`` cannot be called as this backend calls it, or None."""
    return _probe_schema("_cudnn_attention_forward", OP_NAME, OP_ARGUMENTS)


def probe_dense_op() -> str | None:
    """Why ``aten._scaled_dot_product_cudnn_attention`` cannot serve the dense path, or None."""
    return _probe_schema("_scaled_dot_product_cudnn_attention", DENSE_OP_NAME, DENSE_OP_ARGUMENTS)


def probe_cuda() -> str | None:
    """Why no CUDA device with cuDNN (and Triton, for the two small finishing kernels) can run here, or None."""
    import torch
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (the backend finishes ragged results with two small Triton kernels)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not torch.backends.cudnn.is_available():
        return f"torch {torch.__version__} was built without cuDNN"
    version = torch.backends.cudnn.version() or 0
    if version < MIN_CUDNN:
        return f"cuDNN {version} is older than {MIN_CUDNN} (9.0)"
    return None


def device_capability() -> tuple[int, int]:
    """Compute capability of the current CUDA device."""
    import torch
    return torch.cuda.get_device_capability()


REBUILD_HOST_MS = 1.0
"""Host time per call above which a ragged call must be rebuilding its cuDNN graph (a call that reuses its
graph only launches a few kernels; torch 2.11 took ~40 ms per call on the H200)."""


def probe_graph_rebuild(attend=None, device: str = "cuda") -> str | None:
    """Why the installed torch's ragged cuDNN call is unfit for the priority rule and CUDA graphs, or None.

    torch 2.11 never stores the cuDNN graph it builds for its ragged path, so every call builds one
    again: ~40 ms of host time per call on the H200 (measured: 47 ms eager against 5 ms of GPU time at
    4x4096), and a CUDA-graph capture of the call fails (cudaErrorStreamCaptureInvalidated, which also
    leaves torch's CUDA generator unusable, so no capture is attempted here). A tiny call at the
    MLA head dims is timed on the host after one warm call; inputs are constants, so the caller's
    random streams are untouched. ``attend`` / ``device``: the call and device to probe (tests).
    """
    import time

    import torch
    if attend is None:
        from .prefill import cudnn_attend as attend
    q = torch.ones(64, 8, 192, dtype=torch.bfloat16, device=device)
    v = torch.ones(64, 8, 128, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 32, 64], dtype=torch.int32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    host_s = []
    try:
        attend(q, q, v, cu, cu, 32, 32, True, 0.125, False)
        sync()
        for _ in range(3):
            start = time.perf_counter()
            attend(q, q, v, cu, cu, 32, 32, True, 0.125, False)
            host_s.append(time.perf_counter() - start)
        sync()
    except Exception as e:  # noqa: BLE001 (reported as the reason; the priority rule then prefers triton)
        return f"a probe call of {OP_NAME} failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]})"
    ms = sorted(host_s)[1] * 1e3
    if ms > REBUILD_HOST_MS:
        return (f"torch {torch.__version__} builds a new cuDNN graph for every ragged call ({ms:.1f} ms of host time "
                "per call): slow, and a CUDA graph cannot capture it")
    return None


PRIORITY_CAPTURABLE = 250
"""Above triton (200): where both run (bf16/fp16, P unquantized, dense scores) cuDNN measured 1.4x faster
on the H200 (docs/cudnn.md); the autotuner still times both when it tunes. Also the priority of every
problem the dense path serves, whatever the ragged path does."""
PRIORITY_EAGER_ONLY = 150
"""Below triton for ragged problems where the installed torch rebuilds the cuDNN graph on every ragged
call (torch 2.11): each call then costs ~40 ms of host time, and the priority rule also serves CUDA-graph
captures, which must not land on a call that breaks them. The backend stays available by name and to
the autotuner."""


class CudnnBackend(mla_core.Backend):
    name = "cudnn"
    device_types = frozenset({"cuda"})
    description = ("cuDNN fused attention through torch (aten._scaled_dot_product_cudnn_attention for dense batches, "
                   "aten._cudnn_attention_forward for ragged ones): prefill, no build")
    capabilities = {
        "prefill": OpCapability(
            limits={"dtype": frozenset({"bfloat16", "float16"}), "q_quant": _QKV_FORMATS, "k_quant": _QKV_FORMATS,
                    "v_quant": _QKV_FORMATS, "qk_dim": range(8, MAX_HEAD_DIM + 1, 8),
                    "v_dim": range(8, MAX_HEAD_DIM + 1, 8)},
            features=frozenset({"lse", "gqa"}),
            notes="ragged varlen without padding, causal (bottom-right when len_q < len_k) and non-causal, GQA; "
                  "dense batches (one sequence, or equal lengths with one cu_seqlens tensor; no GQA) through the "
                  "dense op at priority 250, which torch caches and CUDA graphs capture, whatever the ragged path "
                  "does; Q/K/V fake quantization as QDQ before cuDNN; P quantization and N:M sparsity are not "
                  "possible"),
    }

    def __init__(self) -> None:
        self._unavailable: str | None | bool = False  # False: not probed yet
        self._rebuilds: str | None | bool = False
        self._no_dense: str | None | bool = False

    @property
    def priority(self) -> int:
        """The ragged path's priority (what ``mla-core backends`` shows); dense problems: :meth:`priority_for`."""
        return PRIORITY_CAPTURABLE if self.rebuild_reason() is None else PRIORITY_EAGER_ONLY

    def priority_for(self, problem) -> int:
        return PRIORITY_CAPTURABLE if self.serves_dense(problem) else self.priority

    def dense_reason(self) -> str | None:
        """Why the dense path (``aten._scaled_dot_product_cudnn_attention``) is off here, or None."""
        if self._no_dense is False:
            self._no_dense = self.unavailable_reason() or probe_dense_op()
        return self._no_dense

    def serves_dense(self, problem) -> bool:
        """Whether ``problem`` (a prefill this backend can run) goes through the dense path: shapes prove the
        batch dense (``dense_batch``), no GQA, and the dense op is there."""
        return (problem.op == "prefill" and bool(problem.get("dense_batch")) and "gqa" not in problem.features
                and self.dense_reason() is None)

    def capture_reason(self, problem) -> str | None:
        """Why a call of ``problem`` cannot be captured in a CUDA graph here, or None."""
        return None if self.serves_dense(problem) else self.rebuild_reason()

    def rebuild_reason(self) -> str | None:
        """Why this backend's calls are slow and cannot be captured in a CUDA graph here, or None.

        Probed once, on the GPU, the first time it is asked outside a capture.
        """
        if self._rebuilds is False:
            import torch
            reason = self.unavailable_reason()
            if reason is None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return "not probed yet (first asked during a capture)"
            self._rebuilds = reason if reason is not None else probe_graph_rebuild()
        return self._rebuilds

    @property
    def version(self) -> str:
        import torch
        return f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else '-'}"

    def unavailable_reason(self) -> str | None:
        if self._unavailable is False:
            self._unavailable = probe_op() or probe_cuda()
        return self._unavailable

    def device_reasons(self, problem) -> list[str]:
        reasons = super().device_reasons(problem)
        if not reasons and problem.device == "cuda":
            cc = device_capability()
            if tuple(cc) < MIN_CAPABILITY:
                reasons.append(f"compute capability {cc[0]}.{cc[1]} (cuDNN fused attention needs "
                               f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer)")
        return reasons

    def why_not(self, problem) -> list[str]:
        reasons = super().why_not(problem)
        if problem.op != "prefill" or (reasons and reasons[0].startswith("unavailable")):
            return reasons
        # Replace the generic feature message with what cuDNN cannot do, and why.
        reasons = [r for r in reasons if "nm_sparsity" not in r]
        if problem.get("p_quant") is not None:
            reasons.append(f"p_quant={problem['p_quant']}: P is fake-quantized inside the fused kernel (per block_n "
                           "tile, against the running maximum); cuDNN keeps P internal, so no QDQ before or after it "
                           "can reproduce that (the triton backend runs it)")
        if "nm_sparsity" in problem.features:
            reasons.append("nm_sparsity: N:M sparsity keeps the N largest scores of each key group, chosen inside the "
                           "kernel; cuDNN's fused attention has no score-rank mask (the triton backend runs it)")
        width = max(problem.get("qk_dim", 0), problem.get("v_dim", 0))
        kv_elements = problem.get("total_k", 0) * problem.get("kv_heads", 1) * width
        if kv_elements >= OFFSET_LIMIT:
            reasons.append(f"total_k bucket {problem.get('total_k')} x {problem.get('kv_heads')} kv heads x {width}: "
                           f"ragged offsets up to {kv_elements} elements overflow the int32 offsets torch gives cuDNN")
        return reasons

    def prefill(self, call, config):
        import torch
        prefill = importlib.import_module(f"{__package__}.prefill")
        dense = self.dense_reason() is None
        if (call.q.is_cuda and torch.cuda.is_current_stream_capturing() and not prefill.takes_dense_path(call, dense)
                and self.rebuild_reason() is not None):
            raise RuntimeError(f"the cudnn backend cannot run this ragged batch inside a CUDA graph capture: "
                               f"{self.rebuild_reason()}; pass backend='triton' for captured ragged prefill")
        return prefill.run(call, config, dense_attend=prefill.cudnn_dense_attend if dense else None)
