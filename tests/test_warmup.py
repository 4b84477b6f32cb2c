"""``mla-core warmup``: presets, the no-GPU message, a CPU run with fake backends, the summary table and JSON."""
import argparse
import contextlib
import json
import warnings

import pytest
import torch
from test_cuda_build import fake_compilers  # noqa: F401 (a fixture: nvcc and c++ that fail with a planted error)

import autotune_fakes as fakes
from mla_core import dispatch
from mla_core.autotune import cache, tuner, warmup
from mla_core.cli import autotune as cli_autotune


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="mla-core")
    cli_autotune.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_warmup_without_gpu_says_so(capsys):
    assert _cli("warmup", "--model", "deepseek-v3", "--tp", "8") == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "--device cpu" in err
    assert _cli("warmup", "--device", "cuda") == 2


def test_presets_cover_tp_sizes_recipes_and_grids():
    default = warmup.preset_problems(warmup.Grid())
    shape = warmup.MODELS["deepseek-v3"]
    decode = [p for p in default if p.op == "decode"]
    assert {p["heads"] for p in default} == {16}  # TP=8: 128 / 8 heads
    assert len(decode) == 3 * len(shape.decode_batches) * len(shape.decode_lengths)
    assert {(p["k_qdq"], p["v_qdq"], p["p_qdq"]) for p in decode} == {(None,) * 3, ("fp8",) * 3, ("nvfp4",) * 3}
    assert {p["num_kv_splits"] for p in decode} == {32} and all(p["kv_lora_rank"] == 512 for p in decode)
    prefill = [p for p in default if p.op == "prefill"]
    assert {(p["qk_dim"], p["v_dim"]) for p in prefill} == {(192, 128)}
    # a prefill recipe quantizes Q, K, V and P alike (decode's quantizes no query: the op has none to quantize)
    assert {(p["q_quant"], p["k_quant"], p["v_quant"], p["p_quant"]) for p in prefill} == {
        (None,) * 4, ("fp8",) * 4, ("nvfp4",) * 4}
    # fresh prompts of 1k..16k tokens and chunks over a cached prefix of 12,288 tokens, with and without LSE
    assert {(p["max_seqlen_q"], p["total_k"]) for p in prefill} == {
        (1024, 1024), (4096, 4096), (16384, 16384), (1024, 16384), (4096, 16384), (16384, 32768)}
    assert len(prefill) == 3 * 6 * 2 and all(p["batch"] == 1 and p["dense_batch"] == 1 for p in prefill)
    assert warmup.describe(next(p for p in prefill if p["total_k"] > p["max_seqlen_q"])).startswith(
        "prefill b=1 L=1024 kv=16384 h=16")
    every_tp = warmup.preset_problems(warmup.Grid(tp=(1, 2, 4, 8), recipes=("bf16",), ops=("decode",),
                                                  batches=(3,), lengths=(1000,), num_kv_splits=(32, "auto")))
    assert sorted({p["heads"] for p in every_tp}) == [16, 32, 64, 128]
    assert {(p["batch"], p["max_len"]) for p in every_tp} == {(4, 1024)}  # explicit lists are bucketed like keys
    assert {p["num_kv_splits"] for p in every_tp} == {32, "auto"} and len(every_tp) == 8


def test_preset_prefill_keys_are_the_keys_real_calls_make():
    """A warm-up key that no call produces would be tuned for nothing: build each (small) preset prefill problem's
    inputs and validate them as the op does (make_call refuses a mismatch)."""
    from mla_core import inputs
    grid = warmup.Grid(ops=("prefill",), recipes=("bf16", "fp8"), prefill_lengths=(16, 33), prefill_cached=(0, 40),
                       heads=(2,), device="cpu")
    problems = warmup.preset_problems(grid)
    assert len(problems) == 2 * 2 * 2 * 2
    for problem in problems:
        call = inputs.make_call(problem, "cpu")
        assert call.k.shape[0] == call.cu_seqlens_k[-1] and call.q.shape[0] <= call.k.shape[0]


def test_warmup_on_cpu_tunes_records_and_reports(fake_world, capsys):
    argv = ["warmup", "--device", "cpu", "--ops", "merge", "--prefill-lengths", "16,32", "--tp", "8",
            "--no-progress", "--json"]
    with pytest.warns(tuner.AutotuneWarning, match="rejected tt_wrong"):
        assert _cli(*argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in report["problems"]] == ["tuned", "tuned"]
    row = report["problems"][0]
    assert row["shape"] == "merge t=16 h=16 d=128"
    assert row["winner"] == 'tt_fast {"sleep_s": 0.001}' and row["runner_up"] == 'tt_fast {"sleep_s": 0.006}'
    # sleeps 16 ms vs 1 ms, but each call also computes on the CPU: on a loaded 2-core machine the ratio fell
    # to 1.997 once, so the test asks only that the speed-up is reported the right way round
    assert row["default"] == "tt_slow" and row["speedup_over_default"] > 1.2
    assert row["rejected"][0]["backend"] == "tt_wrong"
    assert "s in first calls" in row["note"] and "s checking)" in row["note"]  # where the tuning time went
    assert row["timing"] == row["runner_up_timing"] == "eager"  # the CPU has no CUDA graphs
    assert len(cache.user_entries("cpu")) == 2
    choice = dispatch.choose(warmup.preset_problems(warmup.Grid(ops=("merge",), prefill_lengths=(16,), device="cpu"))[0])
    assert choice.backend.name == "tt_fast"
    # a second run finds everything cached and prints the table
    assert _cli(*argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "runner-up" in out and "vs default" in out and "2 already cached" in out
    assert " eager " in out  # the us cells say how each time was measured


def test_warmup_reports_shapes_no_backend_can_run(fake_world, capsys):
    assert _cli("warmup", "--device", "cpu", "--ops", "decode", "--batch", "1", "--lengths", "64", "--recipes", "bf16",
                "--no-progress") == 1
    assert "failed" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# compiling ahead (mla_core.autotune.precompile): real backends, since worker processes load only installed plugins


def _merge_problems(tokens):
    return warmup.preset_problems(warmup.Grid(ops=("merge",), prefill_lengths=tokens, device="cpu"))


def test_precompile_units_are_one_per_kind_backend_and_config_on_the_smallest_problem():
    from mla_core.autotune import precompile
    problems = _merge_problems((32, 1024, 16))
    configs = tuner.candidate_configs(dispatch.candidates(problems[0])[0][0], problems[0])
    units = precompile.units(problems)
    assert len(units) == len(configs) and {u.backend for u in units} == {"triton"}
    assert {u.key for u in units} == {next(p.key() for p in problems if p["tokens"] == 16)}
    # Triton specializes an integer argument equal to 1 or divisible by 16: those sizes are kinds of their own
    decode = warmup.preset_problems(warmup.Grid(ops=("decode",), recipes=("bf16",), batches=(1, 2, 4, 32, 64),
                                                lengths=(1024,), device="cpu"))
    batches = {precompile.Problem.from_key(u.key)["batch"] for u in precompile.units(decode) if u.backend == "triton"}
    assert {1, 2, 32} <= batches and 64 not in batches  # (4 appears where a config is listed for 4 but not for 2)


def test_precompile_runs_every_unit_in_worker_processes_and_reports_failures():
    from mla_core.autotune import precompile
    problems = _merge_problems((16,))
    messages = []
    report = precompile.run(problems, 2, "cpu", progress=messages.append)
    assert report.units == len(precompile.units(problems)) > 0 and report.jobs == 2
    assert not report.failed, report.failed
    assert messages[0].startswith("compiling ahead") and "ran" in report.describe()
    assert precompile.run(problems, 1, "cpu").units == 0  # one job: compile while timing, as before
    bad = precompile.Unit(problems[0].key(), "triton", {"block_h": 3, "num_warps": 4})
    assert precompile.run_unit(bad, "cpu")  # an error line, not an exception


@contextlib.contextmanager
def _rejections_allowed():
    """The CLI-flag tests below tune with the fakes, whose wrong one is fastest only on an idle machine (it
    sleeps 0 ms, the fast one 1 ms): its rejection warning may or may not come; they check instead that it never
    wins (:func:`_assert_wrong_fake_never_cached`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tuner.AutotuneWarning)
        yield


def _assert_wrong_fake_never_cached():
    """What the rejection warning stood for, on a busy machine too: the wrong fake wins no cache entry."""
    entries = cache.user_entries("cpu")
    assert entries and all(e["backend"] != "tt_wrong" for e in entries.values()), entries


def test_warmup_cli_takes_compile_jobs(fake_world, capsys):
    argv = ["warmup", "--device", "cpu", "--ops", "merge", "--prefill-lengths", "16", "--tp", "8", "--no-progress",
            "--compile-jobs", "1"]
    with _rejections_allowed():
        assert _cli(*argv) == 0
    out = capsys.readouterr().out
    assert "tuning s (1st calls, check)" in out
    _assert_wrong_fake_never_cached()


def test_warmup_cli_passes_the_timing_kind_to_the_tuner(fake_world, capsys, monkeypatch):
    seen = []
    original = tuner.tune
    monkeypatch.setattr(tuner, "tune", lambda *a, **kw: seen.append(kw["timing"]) or original(*a, **kw))
    argv = ["warmup", "--device", "cpu", "--ops", "merge", "--prefill-lengths", "16", "--tp", "8", "--no-progress"]
    with _rejections_allowed():
        assert _cli(*argv, "--timing", "eager") == 0
    assert seen == ["eager"]
    with _rejections_allowed():
        assert _cli(*argv, "--force") == 0
    assert seen == ["eager", None]  # None: MLA_CORE_TUNE_TIMING, else auto
    _assert_wrong_fake_never_cached()
    with pytest.raises(SystemExit):
        _cli(*argv, "--timing", "fast")
    assert "invalid choice: 'fast'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# slow backends prepare (the cuda build) in the background while the others compile ahead


def test_default_compile_jobs_are_three_quarters_of_the_cpus_per_local_rank(monkeypatch):
    from mla_core.autotune import precompile
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for cpus, jobs in ((1, 1), (2, 2), (4, 3), (16, 12), (64, 16)):
        monkeypatch.setattr(precompile.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert precompile.default_jobs() == jobs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun, 8 ranks on 128 CPUs: 16 each
    monkeypatch.setattr(precompile.os, "sched_getaffinity", lambda pid: set(range(128)))
    assert precompile.default_jobs() == 12


class _Preparing(fakes.Fast):
    """A fake whose prepare() blocks until released (a build in progress); asking it anything before is recorded."""

    name = "tt_prep"

    def __init__(self, release, fail=False):
        self.release, self.fail, self.asked_early, self.prepared_in = release, fail, [], None

    def prepare(self):
        import threading
        self.prepared_in = threading.current_thread().name
        assert self.release.wait(30)
        if self.fail:
            raise RuntimeError("prepare broke")

    def why_not(self, problem):
        if not self.release.is_set():
            self.asked_early.append(problem.key())
        return super().why_not(problem)


@pytest.mark.parametrize("fail", [False, True])
def test_warmup_prepares_slow_backends_in_the_background_during_compile_ahead(fake_world, monkeypatch, fail):
    import threading

    from mla_core.autotune import precompile
    from mla_core.plugins import registry
    release = threading.Event()
    slow = _Preparing(release, fail)
    registry().backends["tt_prep"] = slow  # fake_world's registry dict: restored after the test
    seen = {}

    def compile_ahead(todo, jobs, device, progress=None, skip=frozenset()):
        seen["skip"], seen["units"] = skip, {u.backend for u in precompile.units(todo, skip)}
        seen["running"] = slow.prepared_in is not None and not release.is_set()  # the build overlaps this phase
        release.set()
        return precompile.Report(jobs=jobs)

    monkeypatch.setattr(precompile, "run", compile_ahead)
    original = tuner.tune

    def tune(*args, **kwargs):
        seen.setdefault("done_before_tuning", release.is_set())
        return original(*args, **kwargs)

    monkeypatch.setattr(tuner, "tune", tune)
    messages = []
    with warnings.catch_warnings():  # the wrong fake's rejection warns only when it times fastest (an idle machine)
        warnings.simplefilter("ignore", tuner.AutotuneWarning)
        rows = warmup.run(_merge_problems((16,)), compile_jobs=4, message=messages.append)
    assert seen["skip"] == {"tt_prep"} and "tt_prep" not in seen["units"] and "tt_fast" in seen["units"]
    assert seen["running"] and seen["done_before_tuning"] and not slow.asked_early
    assert slow.prepared_in.startswith("mla_core-prepare-tt_prep")
    assert messages[0].startswith("preparing tt_prep in the background")
    if fail:  # reported; the backend's availability is asked again when it is used, the warm-up goes on
        assert "tt_prep: prepare() raised RuntimeError: prepare broke" in messages
    else:
        assert any(m.startswith("tt_prep prepared in ") for m in messages)
    assert [r.status for r in rows] == ["tuned"]
    release.set()


def test_a_failed_cuda_build_in_the_background_leaves_the_backend_unavailable_with_the_first_error(monkeypatch,
                                                                                                  fake_compilers):
    import mla_core
    from mla_core_cuda import backend as cuda_backend
    from mla_core_cuda import build
    monkeypatch.setattr(cuda_backend, "device_reason", lambda: None)
    messages = []
    preparing = warmup.prepare_in_background(messages.append)
    assert list(preparing) == ["cuda"]  # the only backend with a prepare()
    warmup.join_prepared(preparing, messages.append)
    assert messages[-1].startswith("cuda prepared in ")  # prepare() itself never raises
    reason = "build failed: planted.cu(7): error: planted compiler failure"
    assert mla_core.get_backend("cuda").unavailable_reason() == reason  # remembered from the background build
    assert (build.build_dir(build.build_key()) / "build.lock").exists()  # built under its file lock
