"""The cuDNN backend object: what the installed torch and cuDNN offer, and why a problem cannot run.

torch exposes cuDNN's fused attention with ragged (cumulative-offset) batches as the private op
``aten._cudnn_attention_forward``; private ops change between torch releases, so its signature is
probed, never assumed, and a mismatch makes the backend unavailable with the reason. Nothing here
touches the GPU at import: the probes run the first time the backend is asked about a problem.
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
MIN_CUDNN = 90000
"""cuDNN 9.0: the oldest release whose fused attention the backend has been written against (ragged offsets,
head dims up to 256); measured with 9.19."""
MIN_CAPABILITY = (8, 0)
"""cuDNN's fused flash attention runs on sm80 (Ampere) and newer."""
MAX_HEAD_DIM = 256
OFFSET_LIMIT = 2 ** 31
"""torch hands cuDNN its ragged offsets (token offset x token stride) as int32."""
_QKV_FORMATS = frozenset({None, "fp8", "nvfp4"})


def probe_op() -> str | None:
    """Why ``aten._cudnn_attention_forward`` cannot be called as this backend calls it, or None."""
    import torch
    try:
        op = torch.ops.aten._cudnn_attention_forward.default
        schema = op._schema
    except (AttributeError, RuntimeError) as e:
        return f"torch {torch.__version__} has no {OP_NAME} ({type(e).__name__})"
    names = tuple(a.name for a in schema.arguments)
    if names[:len(OP_ARGUMENTS)] != OP_ARGUMENTS or "scale" not in names:
        return (f"{OP_NAME} in torch {torch.__version__} takes ({', '.join(names)}); this backend was written for "
                f"({', '.join(OP_ARGUMENTS)}, *, scale)")
    if len(schema.returns) < 2:
        return f"{OP_NAME} in torch {torch.__version__} returns {len(schema.returns)} values, needs (output, logsumexp, ...)"
    return None


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


def probe_capture() -> str | None:
    """Why a ragged cuDNN attention call cannot be captured in a CUDA graph with this torch, or None.

    Runs one tiny call eagerly, then tries to capture the same call in a throwaway graph (torch 2.11
    rebuilds the cuDNN graph of its ragged path on every call, which a capture does not allow).
    """
    import torch
    from .prefill import cudnn_attend
    x = torch.randn(8, 1, 64, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device="cuda")
    cudnn_attend(x, x, x, cu, cu, 5, 5, True, 0.125, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            cudnn_attend(x, x, x, cu, cu, 5, 5, True, 0.125, True)
    except Exception as e:  # noqa: BLE001 (any failure means: not capturable; the message says why)
        torch.cuda.synchronize()
        first_line = (str(e).splitlines() or [""])[0][:160]
        return (f"torch {torch.__version__}'s ragged cuDNN attention cannot be captured in a CUDA graph "
                f"({type(e).__name__}: {first_line})")
    finally:
        del graph
    return None


PRIORITY_CAPTURABLE = 250
"""Above triton (200): where both run (bf16/fp16, P unquantized, dense scores) cuDNN measured 1.4x faster
on the H200 (docs/cudnn.md); the autotuner still times both when it tunes."""
PRIORITY_EAGER_ONLY = 150
"""Below triton where the installed torch cannot capture the ragged cuDNN call: the priority rule also
serves CUDA-graph captures, which must not land on a backend that breaks them."""


class CudnnBackend(mla_core.Backend):
    name = "cudnn"
    device_types = frozenset({"cuda"})
    description = "cuDNN fused attention through torch (aten._cudnn_attention_forward): ragged prefill, no build"
    capabilities = {
        "prefill": OpCapability(
            limits={"dtype": frozenset({"bfloat16", "float16"}), "q_quant": _QKV_FORMATS, "k_quant": _QKV_FORMATS,
                    "v_quant": _QKV_FORMATS, "qk_dim": range(8, MAX_HEAD_DIM + 1, 8),
                    "v_dim": range(8, MAX_HEAD_DIM + 1, 8)},
            features=frozenset({"lse", "gqa"}),
            notes="ragged varlen without padding, causal (bottom-right when len_q < len_k) and non-causal, GQA; "
                  "Q/K/V fake quantization as QDQ before cuDNN; P quantization and N:M sparsity are not possible"),
    }

    def __init__(self) -> None:
        self._unavailable: str | None | bool = False  # False: not probed yet
        self._not_capturable: str | None | bool = False

    @property
    def priority(self) -> int:
        return PRIORITY_CAPTURABLE if self.capture_reason() is None else PRIORITY_EAGER_ONLY

    def capture_reason(self) -> str | None:
        """Why this backend's calls cannot be captured in a CUDA graph here, or None (probed once, on the GPU)."""
        if self._not_capturable is False:
            import torch
            reason = self.unavailable_reason()
            if reason is None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return "not probed yet (first asked during a capture)"
            self._not_capturable = reason if reason is not None else probe_capture()
        return self._not_capturable

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
        if call.q.is_cuda and torch.cuda.is_current_stream_capturing() and self.capture_reason() is not None:
            raise RuntimeError(f"the cudnn backend cannot run inside a CUDA graph capture: {self.capture_reason()}; "
                               "pass backend='triton' for captured prefill")
        return importlib.import_module(f"{__package__}.prefill").run(call, config)
