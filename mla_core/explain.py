"""Which backend serves a call, and why: :func:`explain` (``mla-core explain``).

``mla_core.explain("mla_decode", q, cache, block_table, seq_lens, softmax_scale=...)`` validates the
arguments exactly as the op would (the same :class:`~mla_core.MLAInputError` for bad ones), reduces them to
the op's :class:`~mla_core.problem.Problem`, and answers what dispatch would do with it, without running
a kernel, tuning, or remembering anything:

* ``override``: the ``backend=`` argument, :func:`mla_core.use_backend` or ``MLA_CORE_BACKEND`` names it;
* ``memory``: this process already decided this problem (``first_source`` says how);
* ``cache`` / ``shipped``: the user's autotune cache / the tuned choices shipped for this device;
* ``tuned``: nothing cached and ``MLA_CORE_AUTOTUNE=on``: the first call will tune (explain reports the
  priority choice that serves until then, and says so);
* ``priority``: the valid backend with the highest priority.

Every other loaded backend is listed with its reasons (``why_not``), or, when it could run the problem,
why it was not chosen.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from . import dispatch, ops
from .errors import MLAInputError, NoBackendError
from .plugins import backends, registry
from .problem import Problem

# op name as the Problem names it -> (module, public function, validator); the public names are aliases.
_OPS: dict[str, tuple[str, str, str]] = {
    "decode": ("mla_core.ops", "mla_decode", "mla_core.specs:validate_decode"),
    "prefill": ("mla_core.ops", "mla_prefill", "mla_core.specs:validate_prefill"),
    "merge": ("mla_core.ops", "merge_attn_states", "mla_core.specs:validate_merge"),
    "rope_quantize_fp8": ("mla_core.ops", "mla_rope_quantize_fp8", "mla_core.specs:validate_rope_quantize"),
    "sparse_decode": ("mla_core.ops", "sparse_mla_fp8_decode", "mla_core.specs:validate_sparse_decode"),
    "layer": ("mla_core.layer", "mla_forward", "mla_core.layer:validate_layer"),
}
_ALIASES = {"mla_decode": "decode", "mla_attention_decode": "decode", "mla_prefill": "prefill",
            "mla_prefill_attention": "prefill", "merge_attn_states": "merge", "rope": "rope_quantize_fp8",
            "mla_rope_quantize_fp8": "rope_quantize_fp8", "sparse": "sparse_decode",
            "sparse_mla_fp8_decode": "sparse_decode", "mla_forward": "layer"}


@dataclass
class Explanation:
    """What dispatch would do with one call.

    ``backend`` / ``config``: the choice; ``source``: override | memory | cache | shipped | tuned | priority;
    ``first_source``: for ``memory``, where the remembered choice came from; ``note``: anything the
    source needs said (e.g. tuning pending); ``valid``: every backend that can run the problem, highest
    priority first; ``reasons``: every other loaded backend -> why it is not the choice (why_not's reasons
    for those that cannot run it, "valid, but ..." for those that could).
    """

    op: str
    problem: Problem
    backend: str
    config: dict[str, Any]
    source: str
    valid: list[str]
    reasons: dict[str, list[str]]
    first_source: str | None = None
    note: str = ""
    broken_plugins: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "problem": self.problem.as_dict(), "key": self.problem.key(), "backend": self.backend,
                "config": self.config, "source": self.source, "first_source": self.first_source, "note": self.note,
                "valid": self.valid, "reasons": self.reasons, "broken_plugins": self.broken_plugins}

    def __str__(self) -> str:
        src = self.source + (f" (first decided by: {self.first_source})" if self.first_source else "")
        lines = [f"{self.problem.describe()}",
                 f"  served by: {self.backend}  config: {self.config or '{}'}  source: {src}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        lines.append("  other backends:")
        for name, why in self.reasons.items():
            lines.append(f"    {name}: " + "; ".join(why))
        for name, why in self.broken_plugins.items():
            lines.append(f"    {name} (plugin failed to load): {why}")
        return "\n".join(lines)


def op_names() -> list[str]:
    """Every op name :func:`explain` accepts (problem names and the public function names)."""
    return sorted(set(_OPS) | set(_ALIASES))


def _resolve(path: str) -> Callable:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def public_name(op: str) -> str:
    """The public function name of an op as the README writes it (``"decode"`` -> ``"mla_decode"``)."""
    return _OPS[_canonical(op)][1]


def public_function(op: str) -> Callable:
    """The public function of an op (``"decode"`` or ``"mla_decode"`` -> :func:`mla_core.mla_decode`)."""
    name = _canonical(op)
    module, fn, _ = _OPS[name]
    return getattr(importlib.import_module(module), fn)


def _canonical(op: str) -> str:
    name = _ALIASES.get(op, op)
    if name not in _OPS:
        raise MLAInputError(f"op_name: got {op!r}, needs one of {', '.join(op_names())}")
    return name


def validate(op: str, *args: Any, **kwargs: Any) -> tuple[Problem, Any, str | None]:
    """Validate a call of ``op`` as the op would; returns ``(problem, call object, backend argument)``.

    Raises :class:`~mla_core.MLAInputError` for bad arguments (the op's own message), and for arguments
    the op's signature does not take.
    """
    name = _canonical(op)
    module, fn_name, validator_path = _OPS[name]
    fn = getattr(importlib.import_module(module), fn_name)
    validator = _resolve(validator_path)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise MLAInputError(f"{fn_name}: {exc}") from None
    bound.apply_defaults()
    given = bound.arguments
    backend = given.get("backend")
    if name == "sparse_decode" and (backend is None or backend in ops.FLASHINFER_BACKEND_NAMES):
        backend = None
    wanted = inspect.signature(validator).parameters
    problem, call = validator(**{k: v for k, v in given.items() if k in wanted})
    return problem, call, backend


def explain(op_name: str, *args: Any, **kwargs: Any) -> Explanation:
    """Which backend and config would serve ``op_name(*args, **kwargs)``, where that choice comes from, and why
    every other backend is not it. Validates the call as the op would; runs nothing.

    ``op_name``: ``"mla_decode"`` / ``"decode"``, ``"mla_prefill"`` / ``"prefill"``, ``"merge_attn_states"`` /
    ``"merge"``, ``"mla_rope_quantize_fp8"`` / ``"rope"``, ``"sparse_mla_fp8_decode"`` / ``"sparse"``; the
    arguments are the op's own (``backend=`` included). Raises :class:`~mla_core.MLAInputError` for bad
    arguments and :class:`~mla_core.NoBackendError` when nothing can run the call.
    """
    problem, _, backend = validate(op_name, *args, **kwargs)
    return explain_problem(problem, backend)


def _source_name(source: Callable) -> str:
    return getattr(source, "__name__", "").removesuffix("_choice")


def explain_problem(problem: Problem, backend: str | None = None) -> Explanation:
    """:func:`explain` for a :class:`Problem` (``backend``: the op's ``backend=`` argument)."""
    from .autotune import tuner  # the tool layer: explain reads the tuner's mode; dispatch never imports it
    name = dispatch.requested_backend(backend)
    ok, reasons = dispatch.candidates(problem)
    broken = {b.name: b.reason for b in registry().broken}
    valid = [b.name for b in ok]
    first_source, note = None, ""
    remembered = dispatch._memory.get((name, problem))
    if name is not None:
        chosen = dispatch.get_backend(name)
        why = chosen.why_not(problem)
        if why:
            raise NoBackendError(problem, {name: why})
        choice = remembered or dispatch.Choice(chosen, chosen.configs(problem)[0], "override")
        source = "override"
    elif not ok:
        raise NoBackendError(problem, {**reasons, **{n: [f"plugin failed to load: {r}"] for n, r in broken.items()}})
    elif remembered is not None:
        choice, source, first_source = remembered, "memory", remembered.source
    else:
        choice, source = None, "priority"
        for ask in dispatch._sources:
            if _source_name(ask) == "tuned":
                if tuner.mode() == "on" and not tuner.capturing(problem.device):
                    source = "tuned"
                    note = ("nothing cached and MLA_CORE_AUTOTUNE=on: the first call tunes every valid backend and "
                            "keeps the fastest; until then (and if tuning fails) the priority choice shown serves")
                continue
            try:
                choice = ask(problem, ok)
            except Exception as exc:  # a broken cache file must not stop an explanation
                note = f"choice source {_source_name(ask)!r} failed: {type(exc).__name__}: {exc}"
                choice = None
            if choice is not None:
                source = choice.source
                break
        if choice is None:
            choice = dispatch.Choice(ok[0], ok[0].configs(problem)[0], "priority")
    if name is None and source in ("priority", "tuned"):
        why_source = "highest priority of the valid backends"
    elif name is not None:
        why_source = f"{name!r} was asked for"
    else:
        why_source = f"chosen by {first_source or source}"
    others: dict[str, list[str]] = {}
    for b in sorted(backends().values(), key=lambda b: (-b.priority, b.name)):
        if b is choice.backend:
            continue
        if b.name in reasons:
            others[b.name] = reasons[b.name]
        else:
            others[b.name] = [f"valid (priority {dispatch.priority_for(b, problem)[0]}), but not chosen: "
                              f"{choice.backend.name} (priority {dispatch.priority_for(choice.backend, problem)[0]}) "
                              f"is, {why_source}"]
    return Explanation(problem.op, problem, choice.backend.name, dict(choice.config), source, valid, others,
                       first_source, note, broken)


def with_device(problem: Problem, device: str) -> Problem:
    """``problem`` as it would be on another device type (for explaining a GPU call on a machine without one)."""
    return dataclasses.replace(problem, device=device)


__all__ = ["Explanation", "explain", "explain_problem", "op_names", "public_function", "public_name", "validate",
           "with_device"]
