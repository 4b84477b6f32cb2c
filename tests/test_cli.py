"""The mla-core command line: help, backends, check (summary, exit codes, the interpreter hint), demo, one-line
errors with exit code 2, warmup on a CPU, build."""
import json
import os
import subprocess
import sys

import pytest
import torch

import mla_core
from mla_core import cli, dispatch, plugins
from mla_core.autotune import cache, warmup


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _subprocess(*argv, env=None, timeout=300):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "mla_core.cli", *argv], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("demo", "backends", "check", "explain", "bench", "build", "new-backend", "warmup", "cache"):
        assert command in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU prints")
def test_backends_says_installed_without_cuda_and_available_for_what_runs(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as a user without a GPU runs it
    code, out, _ = _run(capsys, "backends")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line and not line.startswith(" ")}
    assert "installed; no CUDA device" in lines["triton"]
    assert "installed; no CUDA device" in lines["cuda"]
    assert " available " in lines["reference"]
    code, out, _ = _run(capsys, "backends", "--json")
    names = {b["name"]: b for b in json.loads(out)["backends"]}
    assert names["reference"]["runs_here"] and names["reference"]["status"] == "available"
    assert not names["triton"]["runs_here"] and names["triton"]["status"] == "installed; no CUDA device"
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs the triton kernels on the CPU
    code, out, _ = _run(capsys, "backends", "--json")
    assert {b["name"]: b for b in json.loads(out)["backends"]}["triton"]["status"] == "available"


def test_check_json_reports_every_case(capsys):
    code, out, _ = _run(capsys, "check", "--json", "--device", "cpu", "--backend", "reference")
    data = json.loads(out)
    assert code == 0
    ops = {r["op"] for r in data["results"]}
    assert ops == {"decode", "prefill", "merge", "rope_quantize_fp8", "sparse_decode"}
    assert all(r["status"] == "pass" and r["error"] == 0.0 for r in data["results"])
    assert data["summary"]["checked"] == len(data["results"]) and data["summary"]["failed"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU prints")
def test_check_without_gpu_prints_summary_skip_reasons_and_how_to_check_more(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, _ = _run(capsys, "check", "--device", "cpu")
    assert code == 0
    assert "checked 0: 0 passed, 0 failed; skipped" in out
    assert "x triton: device=cpu (supported: cuda)" in out  # each skip reason with its count
    assert "TRITON_INTERPRET=1 mla-core check --backend triton --device cpu" in out


class _WrongMerge(mla_core.Backend):
    """A backend whose merge is wrong (swaps the two inputs' weights): check must fail it."""

    name = "wrong_merge"
    device_types = frozenset({"cpu"})
    capabilities = {"merge": mla_core.OpCapability()}

    def merge(self, call, config):
        from mla_core_reference import merge
        from mla_core.specs import MergeCall
        swapped = MergeCall(call.prefix_output, call.suffix_lse, call.suffix_output, call.prefix_lse, None, None)
        return merge.merge_attn_states_reference(swapped)


class _WrongPlugin:
    @mla_core.hookimpl
    def mla_core_backends(self):
        return [_WrongMerge()]


def test_check_fails_with_exit_code_1_on_a_wrong_backend(capsys):
    try:
        mla_core.register_plugin(_WrongPlugin(), "wrong_merge_plugin")
        code, out, _ = _run(capsys, "check", "--device", "cpu", "--backend", "wrong_merge")
        assert code == 1
        assert "checked 1: 0 passed, 1 failed" in out and "FAIL" in out
        code, out, _ = _run(capsys, "check", "--device", "cpu", "--backend", "wrong_merge", "--json")
        assert code == 1 and json.loads(out)["summary"]["failed"] == 1
    finally:
        plugins.reload()


def test_triton_check_under_the_interpreter_passes_against_the_reference():
    """What the hint tells a user without a GPU to run: the triton kernels really are compared with the reference."""
    done = _subprocess("check", "--backend", "triton", "--device", "cpu", "--json", env={"TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(done.stdout)
    ran = [r for r in data["results"] if r["status"] != "skip"]
    assert {r["backend"] for r in data["results"]} == {"triton"}
    assert {r["op"] for r in ran} >= {"decode", "prefill", "merge"}
    assert all(r["status"] == "pass" for r in ran)
    assert sum(r["error"] > 0 for r in ran) >= 3  # a kernel, not the reference against itself (error 0)
    assert data["summary"] == {**data["summary"], "checked": len(ran), "failed": 0}


@pytest.mark.parametrize("argv, needle", [
    (["check", "--backend", "nope"], "not a loaded mla_core backend"),
    (["bench", "merge", "--backend", "nope", "--device", "cpu"], "not a loaded mla_core backend"),
    (["explain", "decode", "--backend", "nope"], "not a loaded mla_core backend"),
    (["explain", "sparse", "--top-k", "100"], "sparse_mla_top_k"),
    (["build", "--backend", "nope"], "not a loaded mla_core backend"),
])
def test_every_cli_error_is_one_line_with_exit_code_2(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and needle in err and err.startswith(f"mla-core {argv[0]}: ")


@pytest.mark.parametrize("argv", [["check", "--device", "gpu"], ["bench", "decode", "--heads", "x"], ["explain"],
                                  ["cache", "bogus"]])
def test_bad_arguments_are_one_line_with_exit_code_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--help" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("argv", [["demo", "--device", "cuda"], ["check", "--device", "cuda"],
                                  ["bench", "merge", "--device", "cuda"]])
def test_device_cuda_without_cuda_is_one_line_without_traceback(argv):
    done = _subprocess(*argv, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "no CUDA device" in done.stderr and "--device cpu" in done.stderr


def test_demo_runs_on_cpu_with_the_reference(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as a user without a GPU would run it
    dispatch.clear_memory()
    code, out, _ = _run(capsys, "demo", "--json", "--device", "cpu")
    data = json.loads(out)
    assert code == 0
    assert {r["op"] for r in data["ops"]} >= {"mla_decode", "mla_prefill new chunk (causal=True)", "merge_attn_states"}
    assert data["two_chunk_vs_one_shot_rel_l2"] < 1e-2


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "mla_core.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("mla-core ")


class _Bar(list):
    """A progress bar stand-in: records what it was told to show."""

    def __init__(self, items):
        super().__init__(items)
        self.shown = []

    def set_postfix_str(self, text):
        self.shown.append(text)


def test_warmup_on_cpu_records_a_lone_candidate_without_timing_it(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # only the reference can run merge on this CPU
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "shipped_dir", lambda: None)
    dispatch.clear_memory()

    def no_timing(*args, **kwargs):
        raise AssertionError("a problem with one valid candidate was timed")

    monkeypatch.setattr(warmup.tuner, "tune", no_timing)
    problems = warmup.preset_problems(warmup.Grid(ops=("merge",), prefill_lengths=(16, 4096), device="cpu"))
    bars = []
    rows = warmup.run(problems, progress=lambda items: bars.append(_Bar(items)) or bars[-1])
    assert [r.status for r in rows] == ["recorded", "recorded"]
    assert bars[0].shown == [warmup.describe(p) for p in problems]  # the bar names the shape it is on
    entries = cache.user_entries("cpu")
    assert {e["backend"] for e in entries.values()} == {"reference"} and all(e["us"] is None for e in entries.values())
    assert dispatch.choose(problems[0]).backend.name == "reference"
    dispatch.clear_memory()


def test_build_calls_the_backends_that_build_and_reports_failures(capsys):
    class Builds(mla_core.Backend):
        name = "builds_fine"

        def build(self, verbose):
            return None

    class Fails(mla_core.Backend):
        name = "build_fails"

        def build(self, verbose):
            return "nvcc not found: install the CUDA toolkit"

    class Plugin:
        @mla_core.hookimpl
        def mla_core_backends(self):
            return [Builds(), Fails()]

    try:
        mla_core.register_plugin(Plugin(), "build_plugin")
        code, out, _ = _run(capsys, "build", "--json")
        rows = {r["backend"]: r for r in json.loads(out)["builds"]}
        assert code == 1
        assert rows["builds_fine"]["status"] == "built" and rows["build_fails"]["status"] == "FAILED"
        assert rows["build_fails"]["message"] == "nvcc not found: install the CUDA toolkit"
        assert rows["reference"]["status"] == "nothing to build"
        code, out, _ = _run(capsys, "build", "--backend", "builds_fine")
        assert code == 0 and "built" in out
    finally:
        plugins.reload()
