"""The mla-core command line: help, backends, check, demo (JSON and tables)."""
import json
import subprocess
import sys

import pytest

from mla_core import cli, dispatch


def _run(capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("demo", "backends", "check"):
        assert command in out


def test_backends_table_and_json(capsys):
    code, out = _run(capsys, "backends")
    assert code == 0 and "reference" in out and "unavailable" in out  # cuda has no GPU here
    code, out = _run(capsys, "backends", "--json")
    data = json.loads(out)
    names = {b["name"]: b for b in data["backends"]}
    assert names["reference"]["available"] and "decode" in names["reference"]["ops"]
    assert names["cuda"]["reason"]


def test_check_json_reports_every_case(capsys):
    code, out = _run(capsys, "check", "--json", "--device", "cpu", "--backend", "reference")
    data = json.loads(out)
    assert code == 0
    ops = {r["op"] for r in data["results"]}
    assert ops == {"decode", "prefill", "merge", "rope_quantize_fp8", "sparse_decode"}
    assert all(r["status"] == "pass" and r["error"] == 0.0 for r in data["results"])


def test_demo_runs_on_cpu_with_the_reference(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as a user without a GPU would run it
    dispatch.clear_memory()
    code, out = _run(capsys, "demo", "--json", "--device", "cpu")
    data = json.loads(out)
    assert code == 0
    assert {r["op"] for r in data["ops"]} >= {"mla_decode", "mla_prefill new chunk (causal=True)", "merge_attn_states"}
    assert data["two_chunk_vs_one_shot_rel_l2"] < 1e-2


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "mla_core.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("mla-core ")
