"""mla_core.testing.check_backend: built-ins conform; broken plugins are caught, each for its own fault; and the
reference tables of docs/plugins.md are generated from the code (``python tests/test_conformance.py`` rewrites them).
"""
import dataclasses
import importlib.metadata
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import mla_core
from mla_core.explain import public_name, validate
from mla_core.testing import ConformanceError, check_backend
from mla_core.testing import conformance

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "plugin"))
from mla_core_example import ExampleBackend  # noqa: E402  (the skeleton `mla-core new-backend` writes)

DOC = ROOT / "docs" / "plugins.md"


def test_reference_conforms_on_every_op():
    report = check_backend("reference", device="cpu")
    assert report.ok and report.counts()["pass"] > 40 and not report.counts()["refused"]
    assert {r.op for r in report.results} == set(conformance.COVERED_OPS)


def test_triton_merge_conforms_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    report = check_backend("triton", ops=["merge"], device="cpu", max_configs=1)
    assert report.ok and report.counts()["pass"] == len(conformance.cases("merge"))
    assert any("priority 200" in n for n in report.notes)


def test_the_example_plugin_conforms():
    report = check_backend(ExampleBackend())
    assert report.ok and report.counts()["pass"] == len(conformance.cases("merge"))


def _failures(backend) -> str:
    with pytest.raises(ConformanceError) as exc:
        check_backend(backend)
    return str(exc.value)


def test_wrong_numerics_are_caught():
    class Scaled(ExampleBackend):
        def merge(self, call, config):
            out, lse = super().merge(call, config)
            return out.mul_(1.01), lse
    assert "relative L2 error" in _failures(Scaled())


def test_nan_for_empty_rows_is_caught():
    class Naive(ExampleBackend):
        def merge(self, call, config):  # the textbook formula: NaN where both LSEs are -inf, wrong for +inf
            lse = torch.logaddexp(call.prefix_lse, call.suffix_lse)
            out = (torch.exp(call.prefix_lse - lse).t()[..., None] * call.prefix_output.float()
                   + torch.exp(call.suffix_lse - lse).t()[..., None] * call.suffix_output.float())
            return out.to(call.prefix_output.dtype), lse
    text = _failures(Naive())
    assert "-inf/inf row" in text or "NaN" in text


def test_non_contiguous_outputs_are_caught():
    class Strided(ExampleBackend):
        def merge(self, call, config):
            out, lse = super().merge(call, config)
            return (out, lse) if call.output is not None else (out.transpose(0, 1).contiguous().transpose(0, 1), lse)
    assert "not contiguous" in _failures(Strided())


def test_ignoring_the_callers_buffers_is_caught():
    class NewTensors(ExampleBackend):
        def merge(self, call, config):
            return super().merge(dataclasses.replace(call, output=None, output_lse=None), config)
    assert "buffer was not written in place" in _failures(NewTensors())


def test_capability_typos_and_undeclared_ops_are_caught():
    class Typo(ExampleBackend):
        capabilities = {"merge": mla_core.OpCapability(limits={"dtypes": {"float32"}}, features=frozenset({"lse"})),
                        "merge_states": mla_core.OpCapability()}
    text = _failures(Typo())
    assert "limits names 'dtypes', which is not a Problem parameter of merge" in text
    assert "features names 'lse', which no merge call needs" in text
    assert "'merge_states', which is not an mla_core op" in text
    with pytest.raises(ConformanceError, match="asked to check decode, which the backend does not declare"):
        check_backend(ExampleBackend(), ops=["decode"])


def test_bad_configs_are_caught():
    class Empty(ExampleBackend):
        def configs(self, problem):
            return []

    class Opaque(ExampleBackend):
        def configs(self, problem):
            return [{"tile": object()}]
    assert "non-empty list of dicts" in _failures(Empty())
    assert "not JSON-serializable" in _failures(Opaque())


def test_why_not_must_be_honest():
    class Overclaims(ExampleBackend):  # accepts fp16 but cannot run it
        def merge(self, call, config):
            if call.prefix_output.dtype == torch.float16:
                raise TypeError("fp16 is not supported")
            return super().merge(call, config)
    assert "why_not accepted the call but it raised TypeError: fp16 is not supported" in _failures(Overclaims())

    class Mute(ExampleBackend):
        def why_not(self, problem):
            return [""] if problem["dtype"] == "float16" else []
    assert "refused with an empty reason" in _failures(Mute())

    class RefusesAll(ExampleBackend):
        capabilities = {"merge": mla_core.OpCapability(limits={"heads": {1000}})}
    assert "every call the suite built was refused" in _failures(RefusesAll())


def test_an_honest_refusal_passes_and_is_reported():
    class Fp32Only(ExampleBackend):
        capabilities = {"merge": mla_core.OpCapability(limits={"dtype": {"float32"}, "out_dtype": {"float32"}})}
    report = check_backend(Fp32Only())
    assert report.ok and report.counts()["refused"] > 0 and report.counts()["pass"] > 0
    assert "refused" in str(report) and "dtype=bfloat16 (supported: float32)" in str(report)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA-only backend runs on this machine")
def test_a_backend_that_cannot_run_here_is_skipped_under_pytest():
    class CudaOnly(ExampleBackend):
        device_types = frozenset({"cuda"})
    with pytest.raises(pytest.skip.Exception, match="none of its devices"):
        check_backend(CudaOnly())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda", "cudnn", "musa_fp8"])
def test_builtin_backends_conform_on_the_gpu(name):
    """The suite a plugin author runs, on the built-ins: what each declares runs right on the device."""
    if name not in mla_core.backends():
        pytest.skip(f"backend {name!r} is not installed")
    report = check_backend(name, device="cuda", max_configs=2)
    print(report)


# --------------------------------------------------------------------------------------------------
# docs/plugins.md: tables generated from the code


def _builtin_backends() -> list:
    ours = {ep.value.split(".")[0] for ep in importlib.metadata.entry_points(group="mla_core")
            if ep.dist is not None and ep.dist.name == "mla-core"}
    return sorted((b for b in mla_core.backends().values() if type(b).__module__.split(".")[0] in ours),
                  key=lambda b: b.priority)


def _order(value):
    """Numbers numerically, then None and names."""
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def _shown(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype)[6:]} {list(value.shape)}"
    return repr(value)


def generated_tables() -> dict[str, str]:
    """Markdown of each generated block of docs/plugins.md, by block name."""
    keys = ["| op (Problem.op) | public function | parameters (`limits` keys) and the values the suite's calls give "
            "| features |", "| --- | --- | --- | --- |"]
    calls = []
    for op in conformance.COVERED_OPS:
        values: dict[str, set] = {}
        features: set = set()
        for case in conformance.cases(op):
            problem = _validate(op, case)[0]
            for k, v in problem.params:
                values.setdefault(k, set()).add(v)
            features |= problem.features
        params = "<br>".join(f"`{k}`: {', '.join(str(v) for v in sorted(vs, key=_order))}"
                             for k, vs in sorted(values.items()))
        keys.append(f"| `{op}` | `mla_core.{public_name(op)}` | {params} | "
                    f"{', '.join(f'`{f}`' for f in sorted(features)) or '-'} |")
        first = _validate(op, conformance.cases(op)[0])[1]
        doc = _markdown(" ".join((type(first).__doc__ or "").split()))
        buffers = conformance.OUTPUT_BUFFERS[op]
        calls.append(f"**`{op}`** receives `mla_core.specs.{type(first).__name__}`: {doc}\n")
        calls.append("| field | type | in the suite's first call |")
        calls.append("| --- | --- | --- |")
        for f in dataclasses.fields(first):
            note = f" (output buffer: result[{buffers[f.name]}])" if f.name in buffers else ""
            kind = str(f.type).replace("|", "\\|")
            calls.append(f"| `{f.name}` | `{kind}` | {_shown(getattr(first, f.name))}{note} |")
        calls.append("")
    feats = ["| feature | needed when |", "| --- | --- |"] + [f"| `{k}` | {v} |" for k, v in
                                                                 sorted(conformance.FEATURES.items())]
    prio = ["| built-in backend | priority | devices | ops |", "| --- | --- | --- | --- |"]
    interpret = os.environ.pop("TRITON_INTERPRET", None)  # devices as a user sees them, not as CI runs triton
    try:
        for b in _builtin_backends():
            prio.append(f"| `{b.name}` | {b.priority} | {', '.join(sorted(b.device_types))} | "
                        f"{', '.join(sorted(b.capabilities)) or 'none'} |")
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
    return {"capability-keys": "\n".join(keys), "features": "\n".join(feats), "call-objects": "\n".join(calls).rstrip(),
            "priorities": "\n".join(prio)}


def _markdown(rst: str) -> str:
    """Docstring RST roles and literals as Markdown code."""
    return re.sub(r"``([^`]+)``", r"`\1`", re.sub(r":(?:func|class|data|meth):`~?([^`]+)`", r"`\1`", rst))


def _validate(op, case):
    return validate(op, **case.build("cpu"))


_BLOCK = re.compile(r"(?P<head><!-- generated: (?P<name>[a-z-]+)[^>]*-->)\n(?P<body>(?:(?!<!-- ).)*?)\n?"
                    r"(?P<end><!-- end generated -->)", re.S)


def _rewrite(text: str, tables: dict[str, str]) -> str:
    return _BLOCK.sub(lambda m: f"{m['head']}\n{tables[m['name']]}\n{m['end']}", text)


def test_docs_tables_match_the_code():
    text = DOC.read_text()
    names = {m.group("name") for m in _BLOCK.finditer(text)}
    tables = generated_tables()
    assert names == set(tables), f"docs/plugins.md must hold the generated blocks {sorted(tables)}"
    assert _rewrite(text, tables) == text, "docs/plugins.md is stale: run `python tests/test_conformance.py`"


def test_every_feature_the_calls_need_is_described():
    seen = set()
    for op in conformance.COVERED_OPS:
        seen |= set(conformance.op_vocabulary(op)[1])
    assert seen == set(conformance.FEATURES)


def test_builtin_priority_scale():
    prio = {b.name: b.priority for b in _builtin_backends()}
    assert prio["reference"] == 0 and prio["musa_fp8"] == 150 and prio["triton"] == 200 and prio["cuda"] == 180


if __name__ == "__main__":
    DOC.write_text(_rewrite(DOC.read_text(), generated_tables()))
    print(f"rewrote the generated tables of {DOC}")
