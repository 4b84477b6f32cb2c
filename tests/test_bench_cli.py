"""`mla-core bench`: every valid backend timed on the user's shapes, roofline counts, CPU mode without ceilings,
JSON, the optional plot; benchmarks/common.py uses the package's timing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mla_core import bench, cli, dispatch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cpu_only(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the reference alone runs here: quick
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    dispatch.clear_memory()
    yield tmp_path
    dispatch.clear_memory()


def test_roofline_counts_follow_the_documented_formulas():
    w = bench.workload("decode", materialize=False, batch=3, heads=16, length=100)
    assert w.flops == 2 * 3 * 16 * 100 * (576 + 512) and w.nbytes == 3 * 100 * 576 * 2
    brute = sum(1 for i in range(5) for j in range(9) if j <= i + 9 - 5)
    assert bench.causal_pairs(5, 9, True) == brute and bench.causal_pairs(5, 9, False) == 45
    p = bench.workload("prefill", materialize=False, batch=2, heads=4, length=5, kv_length=9)
    assert p.flops == 2 * 4 * 2 * brute * (192 + 128)
    s = bench.workload("sparse", materialize=False, batch=2, heads=8, top_k=128)
    assert s.flops == 2 * 2 * 1 * 8 * 128 * (576 + 512)


def test_unmaterialized_workloads_validate_to_the_real_problem():
    from mla_core.explain import validate
    for op, shape in [("decode", dict(batch=5, heads=8, length=300, recipe="fp8", page_size=16)),
                      ("prefill", dict(batch=2, heads=4, length=70, kv_heads=2, recipe="nvfp4")),
                      ("merge", dict(tokens=33, heads=3, head_dim=64)), ("rope", dict(tokens=17, heads=2)),
                      ("sparse", dict(batch=2, heads=16, top_k=128))]:
        real = validate(bench.workload(op, **shape).op, **bench.workload(op, **shape).kwargs)[0]
        light = validate(bench.workload(op, materialize=False, **shape).op,
                         **bench.workload(op, materialize=False, **shape).kwargs)[0]
        assert light == real, op


def test_bench_on_cpu_times_every_valid_backend_and_claims_no_ceilings(cpu_only, capsys):
    code = cli.main(["bench", "merge", "--tokens", "16,64", "--heads", "2", "--device", "cpu", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "no ceilings measured" in out and "merge T=16 H=2 D=128" in out and "merge T=64 H=2 D=128" in out
    code = cli.main(["bench", "merge", "--tokens", "16", "--heads", "2", "--device", "cpu", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 0 and report["ceilings"] is None and report["device"] == "cpu"
    (row,) = report["rows"]
    assert row["backend"] == "reference" and row["dispatch_pick"] and row["eager_us"] > 0 and row["graph_us"] is None
    assert row["gbps"] > 0 and row["pct_copy"] is None and row["x_fastest"] == 1.0
    assert "[1/1] merge T=16 H=2 D=128: reference" in captured.err  # progress on stderr


def test_bench_compares_backends_with_a_ratio(cpu_only, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # triton runs merge on the CPU too: two backends, one ratio
    code = cli.main(["bench", "merge", "--tokens", "8", "--heads", "2", "--head-dim", "16", "--device", "cpu",
                     "--json", "--quiet"])
    rows = {r["backend"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert code == 0 and set(rows) == {"triton", "reference"}
    assert min(r["x_fastest"] for r in rows.values()) == 1.0 and max(r["x_fastest"] for r in rows.values()) >= 1.0
    assert rows["triton"]["dispatch_pick"] and not rows["reference"]["dispatch_pick"]


def test_plot_without_matplotlib_is_one_line(cpu_only, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    code = cli.main(["bench", "merge", "--tokens", "8", "--device", "cpu", "--plot", "x.png"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "pip install 'mla-core[plot]'" in err


def test_plot_draws_the_shapes(cpu_only, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png, js = tmp_path / "roof.png", tmp_path / "bench.json"
    code = cli.main(["bench", "merge", "--tokens", "8,32", "--heads", "2", "--device", "cpu", "--quiet",
                     "--plot", str(png), "--output", str(js)])
    assert code == 0 and png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert len(json.loads(js.read_text())["rows"]) == 2


def test_benchmark_scripts_use_the_package_timing():
    done = subprocess.run([sys.executable, "-c", "import common, mla_core.bench as b; "
                           "assert common.time_graph is b.time_graph and common.measure_ceilings is b.measure_ceilings"],
                          cwd=ROOT / "benchmarks", capture_output=True, text=True, env={**os.environ})
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
def test_bench_decode_on_the_gpu_with_ceilings_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roof.png"
    code = cli.main(["bench", "decode", "--heads", "16", "--batch", "4", "--length", "1024", "--recipe", "bf16,nvfp4",
                     "--json", "--quiet", "--plot", str(png), "--iters", "5"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ceilings"]["copy_gbps"] > 100 and png.exists()
    fast = [r for r in report["rows"] if r["backend"] != "reference"]
    assert fast and all(r["graph_us"] and r["pct_copy"] > 0 for r in fast)
    assert torch.cuda.is_available()


def test_gpu_flow_on_the_cpu_with_stand_in_timers(cpu_only, capsys, monkeypatch, tmp_path):
    """The GPU path's bookkeeping (ceilings, graph and eager columns, % of ceilings, the reference's eager-only
    row, the roofline plot) with the timers replaced: what `mla-core bench` prints on the H200."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(cli, "resolve_device", lambda d: "cuda")
    real_workload = bench.workload
    monkeypatch.setattr(bench, "workload", lambda op, device="cpu", **kw: real_workload(op, device="cpu", **kw))
    monkeypatch.setattr(bench, "measure_ceilings", lambda: {"copy_gbps": 4000.0, "bf16_tflops": 700.0})
    calls = []

    def timer(us):
        def time(fn, iters=1, warmup=1, flush=True):
            fn()
            calls.append(us)
            return us
        return time

    monkeypatch.setattr(bench, "time_graph", timer(10.0))
    monkeypatch.setattr(bench, "time_eager", timer(40.0))
    png = Path(os.environ.get("MLA_CORE_TEST_PLOT") or tmp_path / "roof.png")
    plot = ["--plot", str(png)] if _has_matplotlib() else []
    code = cli.main(["bench", "merge", "--tokens", "8", "--heads", "2", "--head-dim", "16", "--json", "--quiet",
                     *plot])
    report = json.loads(capsys.readouterr().out)
    rows = {r["backend"]: r for r in report["rows"]}
    assert code == 0 and report["ceilings"]["copy_gbps"] == 4000.0 and "CUDA-graph" in report["timing"]
    assert rows["triton"]["graph_us"] == 10.0 and rows["triton"]["eager_us"] == 40.0 and rows["triton"]["us"] == 10.0
    assert rows["triton"]["pct_copy"] == pytest.approx(100 * rows["triton"]["gbps"] / 4000.0)
    assert rows["reference"]["graph_us"] is None and "eager only" in rows["reference"]["note"]
    assert rows["reference"]["x_fastest"] == 4.0
    assert not plot or png.stat().st_size > 10_000


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
