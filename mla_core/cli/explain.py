"""``mla-core explain OP [shape options]``: which backend would serve a call of that shape, from where, and why not
the others. Also the shape options ``mla-core bench`` shares.
"""
from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

from .. import bench
from ..explain import explain_problem, validate, with_device
from .args import int_list, name_list, split_list

# CLI op -> (help, [(option, dest, type, default, help)])
SHAPE_OPTIONS: dict[str, tuple[str, list[tuple[str, str, Any, Any, str]]]] = {}


_RECIPE = ("--recipe", "recipe", name_list(tuple(bench.RECIPES)), ("bf16",),
           "quant recipe(s): bf16 (none), fp8 or nvfp4 (decode: K, V and P fake-quantized; prefill: Q too)")
_DTYPE = ("--dtype", "dtype", name_list(tuple(bench.DTYPES)), ("bf16",), "input dtype(s): bf16, fp16, fp32")

SHAPE_OPTIONS.update({
    "decode": ("absorbed decode over a paged latent cache (576 = 512 latent + 64 rope)", [
        ("--batch", "batch", int_list, (32,), "requests per batch"),
        ("--heads", "heads", int_list, (16,), "query heads (DeepSeek-V3: 128 / TP)"),
        ("--length", "length", int_list, (8192,), "cached tokens per request"),
        ("--page-size", "page_size", int_list, (64,), "tokens per cache page"),
        ("--splits", "num_kv_splits", split_list, (32,), "num_kv_splits: 1..128 or auto"),
        _RECIPE, _DTYPE]),
    "prefill": ("varlen prefill (un-absorbed, qk 192 / v 128)", [
        ("--batch", "batch", int_list, (1,), "sequences"),
        ("--heads", "heads", int_list, (16,), "query heads"),
        ("--length", "length", int_list, (4096,), "queries per sequence"),
        ("--kv-length", "kv_length", int_list, None, "keys per sequence (default: --length)"),
        ("--kv-heads", "kv_heads", int_list, None, "key/value heads (GQA; default: --heads)"),
        ("--qk-dim", "qk_dim", int_list, (192,), "q/k head dim"),
        ("--v-dim", "v_dim", int_list, (128,), "v head dim"),
        _RECIPE, _DTYPE]),
    "merge": ("merge_attn_states of two partial results", [
        ("--tokens", "tokens", int_list, (4096,), "tokens"),
        ("--heads", "heads", int_list, (16,), "heads"),
        ("--head-dim", "head_dim", int_list, (128,), "head dim"),
        _DTYPE]),
    "rope": ("mla_rope_quantize_fp8: RoPE + FP8 quantization of Q and K", [
        ("--tokens", "tokens", int_list, (4096,), "tokens"),
        ("--heads", "heads", int_list, (16,), "query heads"),
        ("--dtype", "dtype", name_list(("bf16", "fp16")), ("bf16",), "input dtype(s): bf16, fp16")]),
    "sparse": ("sparse_mla_fp8_decode: DeepSeek-V3.2 FP8 top-k sparse decode", [
        ("--batch", "batch", int_list, (32,), "requests"),
        ("--heads", "heads", int_list, (128,), "query heads"),
        ("--q-len", "q_len", int_list, (1,), "query tokens per request"),
        ("--top-k", "top_k", int_list, (2048,), "selected cache rows per query (a multiple of 64)")]),
})


def add_shape_options(p: argparse.ArgumentParser, op: str) -> None:
    """The shape options of CLI op ``op``; every one takes a comma-separated list (their product is run)."""
    for flag, dest, kind, default, text in SHAPE_OPTIONS[op][1]:
        shown = "" if default is None else f" (default {','.join(map(str, default))})"
        p.add_argument(flag, dest=dest, type=kind, default=default, help=text + shown)
    if op == "prefill":
        p.add_argument("--no-causal", dest="causal", action="store_false", help="non-causal (a cached-context chunk)")


def shapes(op: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One shape (keyword arguments of the op's workload builder) per combination of the shape options' values."""
    names = [dest for _, dest, _, _, _ in SHAPE_OPTIONS[op][1]]
    lists = [getattr(args, n) if getattr(args, n) is not None else (None,) for n in names]
    out = []
    for values in itertools.product(*lists):
        shape = {n: v for n, v in zip(names, values) if v is not None}
        if op == "prefill":
            shape["causal"] = args.causal
        out.append(shape)
    return out


def cmd_explain(args) -> int:
    from . import cuda_available
    device = args.device or ("cuda" if cuda_available() else "cpu")
    results = []
    for shape in shapes(args.op, args):
        w = bench.workload(args.op, materialize=False, **shape)
        problem, _, _ = validate(w.op, **w.kwargs)
        results.append((w, explain_problem(with_device(problem, device), args.backend)))
    if args.json:
        print(json.dumps([{"shape": w.label, **e.as_dict()} for w, e in results], indent=2, default=str))
        return 0
    for w, e in results:
        print(f"{w.label} on {device}:")
        print(str(e))
    if device == "cuda" and not cuda_available():
        print("(no CUDA device here: the answer is what a machine with one would do, from the cache and the "
              "backends installed here)")
    return 0


def add_parser(subparsers) -> None:
    """Add ``explain`` (one sub-command per op) to the ``mla-core`` subparsers."""
    p = subparsers.add_parser(
        "explain", help="which backend would serve a call of a given shape, where that choice comes from, why not others",
        description="Builds the call of the given shape (nothing runs, nothing is allocated at full size), validates it "
                    "as the op would, and prints the backend and config dispatch would pick, where the choice comes "
                    "from (override / memory / cache / shipped / tuned / priority) and every other backend's "
                    "reasons. Example: mla-core explain decode --heads 16 --batch 32 --length 8192 --recipe nvfp4")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    for op, (text, _) in SHAPE_OPTIONS.items():
        q = ops.add_parser(op, help=text, description=f"Explain the dispatch of {text}.")
        add_shape_options(q, op)
        q.add_argument("--device", choices=("cpu", "cuda"),
                       help="device type to explain for (default: cuda when available; cuda works without a GPU too)")
        q.add_argument("--backend", help="explain as if backend=NAME were passed")
        q.add_argument("--json", action="store_true", help="print machine-readable JSON")
        q.set_defaults(func=cmd_explain)
