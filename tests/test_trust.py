"""Trust: a cache file, a plugin or a backend's result can never poison dispatch (issue 7, items 2-5 and 8).

Every test here failed on 6ed19c9: cached configs were run unchecked, hostile files hung or crashed every
op, one faulty plugin broke every op, results were passed on unchecked, and `cache export` overwrote files.
"""
import argparse
import json
import os
import stat
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch

import autotune_fakes as fakes
import mla_core
from mla_core import dispatch, inputs, plugins
from mla_core.accuracy import rel_l2
from mla_core.autotune import cache, tuner
from mla_core.backend import BackendOutputError, result_checks
from mla_core.cli import autotune as cli_autotune
from mla_core.problem import Problem


def _entry(owner, config=None, /, **version_changes):
    return {"backend": owner.name, "config": {} if config is None else config,
            "versions": {**cache.versions(owner, "cpu"), **version_changes}}


def _merge_args(seed=3):
    g = torch.Generator().manual_seed(seed)
    return dict(prefix_output=torch.randn(64, 4, 32, generator=g), prefix_lse=torch.randn(4, 64, generator=g),
                suffix_output=torch.randn(64, 4, 32, generator=g), suffix_lse=torch.randn(4, 64, generator=g))


def _write_user_file(entries: dict) -> Path:
    path = cache.user_file("cpu")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(cache.dump("cpu", entries))
    path.chmod(0o600)
    return path


def _cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]


# --------------------------------------------------------------------------------------------------
# item 2: cached configs are validated by their backend before use


@pytest.mark.parametrize("config", [{"sleep_s": -1.0}, {"sleep_s": "0.001"}, {"sleep_s": True}, {"v_split": 0},
                                    {"sleep_s": 0.001, "num_kv_splits": 0}])
def test_invalid_cached_config_is_skipped_with_one_warning_and_never_run(fake_world, config, monkeypatch):
    problem = fakes.merge_problem()
    path = _write_user_file({problem.key(): _entry(fake_world["tt_fast"], config)})
    ran = []
    monkeypatch.setattr(type(fake_world["tt_fast"]), "merge", lambda self, call, cfg: ran.append(cfg))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = mla_core.merge_attn_states(**_merge_args())
        dispatch.clear_memory()
        assert dispatch.choose(problem).source == "priority"  # asked again: still skipped, not warned again
    assert out.shape == (64, 4, 32) and ran == []
    messages = [m for m in _cache_warnings(caught) if "ignored" in m]
    assert len(messages) == 1 and str(path) in messages[0] and problem.key() in messages[0]


def test_listed_cached_config_is_used(fake_world):
    problem = fakes.merge_problem()
    _write_user_file({problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    choice = dispatch.choose(problem)
    assert (choice.backend.name, choice.config, choice.source) == ("tt_fast", {"sleep_s": 0.001}, "cache")


def _decode_problem(splits="auto"):
    return Problem.make("decode", "cuda", {"lse"}, dtype="bfloat16", out_dtype="bfloat16", heads=16,
                        kv_lora_rank=512, rope_dim=64, page_size=64, num_kv_splits=splits, k_qdq=None, v_qdq=None,
                        p_qdq=None, batch=1, max_len=4096)


def test_triton_refuses_the_configs_that_broke_decode():
    triton = mla_core.get_backend("triton")
    problem = _decode_problem()
    good = triton.configs(problem)[0]
    assert triton.validate_config(problem, good) == []
    assert triton.validate_config(problem, {**good, "num_kv_splits": 4}) == []
    for bad in ({**good, "v_split": 0}, {**good, "v_split": -2}, {**good, "block_h": "16"},
                {**good, "block_h": 10 ** 30}, {**good, "num_kv_splits": 0}, {**good, "num_kv_splits": 129},
                {**good, "num_kv_splits": True}, {**good, "num_kv_splits": 4.0}, [], "x"):
        assert triton.validate_config(problem, bad), bad
    fixed = _decode_problem(32)  # the caller's split count is part of the problem: never carried by a config
    assert triton.validate_config(fixed, {**triton.configs(fixed)[0], "num_kv_splits": 4})


def test_every_shipped_entry_is_valid_for_its_backend():
    for key, entry in cache.shipped_entries("NVIDIA H200").items():
        backend = mla_core.get_backend(entry["backend"])
        assert backend.validate_config(Problem.from_key(key), entry["config"]) == [], key


def test_stale_shipped_entry_is_ignored_and_stale_user_entry_too(fake_world, monkeypatch, tmp_path):
    """Issue 13: a shipped choice from other versions (an upgrade) must not run, exactly like a user one."""
    problem = fakes.merge_problem()
    ship = tmp_path / "shipped"
    ship.mkdir()
    for field in ("mla_core", "backend", "torch", "triton", "device"):
        (ship / "cpu.json").write_text(cache.dump("cpu", {
            problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.006}, **{field: "0.0-stale"})}))
        monkeypatch.setattr(cache, "shipped_dir", lambda: ship)
        dispatch.clear_memory()
        assert dispatch.choose(problem).source == "priority", field
    (ship / "cpu.json").write_text(cache.dump("cpu", {problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.006})}))
    dispatch.clear_memory()
    assert dispatch.choose(problem).source == "shipped"  # the same entry, current, is used
    _write_user_file({problem.key(): _entry(fake_world["tt_exact"], {}, torch="0.0-stale")})
    dispatch.clear_memory()
    assert dispatch.choose(problem).source == "shipped"  # the stale user entry does not win over it


def test_cache_folder_0700_and_files_0600(fake_world):
    assert cache.store("cpu", {fakes.merge_problem().key(): _entry(fake_world["tt_fast"])})
    folder, path = cache.user_dir(), cache.user_file("cpu")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(str(path) + ".lock").stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("target,mode", [("file", 0o666), ("file", 0o620), ("folder", 0o777), ("folder", 0o770)])
def test_group_or_world_writable_cache_is_ignored(fake_world, target, mode):
    problem = fakes.merge_problem()
    path = _write_user_file({problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    assert dispatch.choose(problem).source == "cache"  # trusted as it is
    (path if target == "file" else path.parent).chmod(mode)
    dispatch.clear_memory()
    with pytest.warns(cache.CacheWarning, match="writable"):
        assert dispatch.choose(problem).source == "priority"
    assert path.exists()  # ignored, not moved: it may not even be ours to move


def test_world_writable_folder_is_never_written(fake_world):
    folder = cache.user_dir()
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    with pytest.warns(cache.CacheWarning, match="not writable"):
        assert not cache.store("cpu", {fakes.merge_problem().key(): _entry(fake_world["tt_fast"])})
    assert list(folder.iterdir()) == []  # not even a lock file


def test_file_owned_by_another_user_is_ignored(fake_world, monkeypatch):
    problem = fakes.merge_problem()
    _write_user_file({problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    monkeypatch.setattr(cache, "_trusted_owners", lambda: {os.getuid() + 4242})  # as if another user wrote it
    with pytest.warns(cache.CacheWarning, match="owned by another user"):
        assert dispatch.choose(problem).source == "priority"


def test_sync_never_unpickles(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(dist, "broadcast_object_list", lambda *a, **k: pytest.fail("pickled objects travelled"))
    payload = json.dumps({}).encode()

    def broadcast(tensor, src, group=None):
        if tensor.dtype == torch.int64:
            tensor.fill_(len(payload))
        else:
            assert tensor.dtype == torch.uint8
            tensor.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))

    monkeypatch.setattr(dist, "broadcast", broadcast)
    assert tuner.sync() == 0


# --------------------------------------------------------------------------------------------------
# item 3: hostile cache files


def _op_survives(expect_warning=True):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, lse = mla_core.merge_attn_states(**_merge_args())
    assert out.shape == (64, 4, 32) and torch.isfinite(out).all()
    assert dispatch.choose(fakes.merge_problem()).source == "priority"
    if expect_warning:
        assert _cache_warnings(caught), "no CacheWarning"
    return _cache_warnings(caught)


def test_deeply_nested_json_is_set_aside(fake_world):
    path = cache.user_file("cpu")
    path.parent.mkdir(parents=True)
    path.write_text("[" * 200000 + "]" * 200000)
    assert any("nested too deeply" in m for m in _op_survives())
    assert not path.exists() and len(list(path.parent.glob("cpu.json.corrupt-*"))) == 1


def test_fifo_never_hangs(fake_world):
    path = cache.user_file("cpu")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    done = []
    worker = threading.Thread(target=lambda: done.append(_op_survives()), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "the first op hung on a FIFO"
    assert any("not a regular file" in m for m in done[0])


def test_symlink_to_dev_zero_is_set_aside(fake_world):
    path = cache.user_file("cpu")
    path.parent.mkdir(parents=True)
    os.symlink("/dev/zero", path)
    assert any("symbolic link" in m for m in _op_survives())
    assert not os.path.lexists(path) and os.path.exists("/dev/zero")


def test_oversized_file_is_set_aside(fake_world, monkeypatch):
    monkeypatch.setattr(cache, "MAX_FILE_BYTES", 4096)
    problem = fakes.merge_problem()
    filler = {fakes.merge_problem(tokens=t).key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})
              for t in range(1, 64)}
    _write_user_file({**filler, problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    assert any("byte limit" in m for m in _op_survives())


@pytest.mark.parametrize("kind", ["nested", "fifo", "dev_zero", "schema"])
def test_hostile_shipped_file_is_ignored_never_moved(fake_world, monkeypatch, tmp_path, kind):
    ship = tmp_path / "shipped"
    ship.mkdir()
    path = ship / "cpu.json"
    if kind == "nested":
        path.write_text("{" * 100000)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    else:
        path.write_text(json.dumps({"format": "mla_core-autotune", "schema": 99, "entries": {}}))
    monkeypatch.setattr(cache, "shipped_dir", lambda: ship)
    _op_survives()
    assert os.path.lexists(path) and [p.name for p in ship.iterdir()] == ["cpu.json"]


# --------------------------------------------------------------------------------------------------
# item 4: faulty plugins


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site folder on sys.path for dist-info entry points and plugin modules; plugins reloaded after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    dispatch.clear_memory()
    yield tmp_path
    monkeypatch.undo()
    import importlib
    importlib.invalidate_caches()
    plugins.reload()


PLUGIN = textwrap.dedent("""
    import sys
    import mla_core
    from mla_core import OpCapability

    class Faulty(mla_core.Backend):
        name = {name!r}
        version = "1"
        priority = 10_000  # would win everything if it were trusted
        device_types = frozenset({{"cpu"}})
        capabilities = {{"merge": OpCapability()}}

        def merge(self, call, config):
            raise AssertionError("a faulty plugin ran")

    {body}

    @mla_core.hookimpl
    def mla_core_backends():
        return [Faulty()]
""")


def _plugin(site: Path, module: str, entry: str, name: str, body: str) -> None:
    import importlib
    (site / f"{module}.py").write_text(PLUGIN.format(name=name, body=textwrap.dedent(body)))
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mla_core]\n{entry} = {module}\n")
    importlib.invalidate_caches()


FAULTS = {
    "unavailable_raises": "Faulty.unavailable_reason = lambda self: 1 / 0",
    "why_not_raises": "Faulty.why_not = lambda self, problem: (_ for _ in ()).throw(SystemExit(4))",
    "configs_raise": "Faulty.configs = lambda self, problem: {}['missing']",
    "capabilities_list": "Faulty.capabilities = ['merge']",
    "priority_str": "Faulty.priority = 'high'",
    "device_types_str": "Faulty.device_types = 'cpu'",
    "version_int": "Faulty.version = 3",
    "op_without_method": "Faulty.capabilities = {'merge': OpCapability(), 'decode': OpCapability()}",
    "unknown_op": "Faulty.capabilities = {'merge': OpCapability(), 'decoder': OpCapability()}",
    "exit_at_import": "sys.exit(3)",
    "generator_exit_at_import": "raise GeneratorExit",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faulty_plugin_never_breaks_other_backends(site, fault, capsys):
    _plugin(site, f"mla_core_faulty_{fault}", "faulty", "faulty", FAULTS[fault])
    reg = plugins.reload()
    args = inputs.merge_inputs(5, heads=2, head_dim=8, dtype=torch.float32, seed=1)
    out, lse = mla_core.merge_attn_states(**args)  # served by a working backend
    ref, _ = mla_core.merge_attn_states(**args, backend="reference")
    assert rel_l2(out, ref) < 1e-5
    problem, _ = mla_core.specs.validate_merge(**args, output=None, output_lse=None)
    assert dispatch.choose(problem).backend.name != "faulty"
    if "faulty" not in reg.backends:  # refused at load: listed broken, and asking for it by name says why
        assert "faulty" in {b.name for b in reg.broken}
        with pytest.raises(mla_core.MLAInputError, match="broken"):
            mla_core.merge_attn_states(**args, backend="faulty")
    else:  # refused at call time: the exception is its reason
        assert "raised" in " ".join(dispatch.candidates(problem)[1]["faulty"])
    from mla_core import cli
    assert cli.main(["backends"]) == 0 and "faulty" in capsys.readouterr().out
    assert cli.main(["backends", "--json"]) == 0


@pytest.mark.parametrize("fault", ["capabilities_list", "priority_str", "op_without_method"])
def test_broken_plugin_is_listed_with_the_reason(site, fault):
    _plugin(site, f"mla_core_faulty_{fault}", "faulty", "faulty", FAULTS[fault])
    reg = plugins.reload()
    reason = {b.name: b.reason for b in reg.broken}["faulty"]
    assert {"capabilities_list": "capabilities", "priority_str": "priority",
            "op_without_method": "no decode() method"}[fault] in reason


def test_builtin_names_are_reserved_and_the_later_plugin_is_the_broken_one(site):
    _plugin(site, "mla_core_a_shadow", "a_shadow", "reference", "")  # sorts before `reference`
    _plugin(site, "mla_core_z_twin", "z_twin", "twin", "")
    _plugin(site, "mla_core_zz_twin", "zz_twin", "twin", "")
    reg = plugins.reload()
    assert type(mla_core.get_backend("reference")).__module__ == "mla_core_reference.backend"
    broken = {b.name: b.reason for b in reg.broken}
    assert "reserved" in broken["a_shadow"] and "reference" not in broken
    assert "already taken" in broken["zz_twin"] and "z_twin" not in broken
    args = inputs.merge_inputs(5, heads=2, head_dim=8, dtype=torch.float32, seed=1)
    mla_core.merge_attn_states(**args, backend="reference")


def test_runtime_plugin_cannot_take_a_builtin_name():
    class Impostor(mla_core.Backend):
        name = "triton"

    class Plugin:
        @mla_core.hookimpl
        def mla_core_backends(self):
            return [Impostor()]

    try:
        assert mla_core.register_plugin(Plugin(), "impostor") == []
        assert type(mla_core.get_backend("triton")).__name__ == "TritonBackend"
        assert "reserved" in {b.name: b.reason for b in plugins.registry().broken}["impostor"]
    finally:
        plugins.reload()


# --------------------------------------------------------------------------------------------------
# item 5: results are checked against the op's spec


class _Liar(mla_core.Backend):
    name, version, priority = "tt_liar", "1", 5000
    device_types = frozenset({"cpu"})
    capabilities = {"merge": mla_core.OpCapability()}
    lie = "short"

    def merge(self, call, config):
        out, lse = fakes.merge_math(call)
        if self.lie == "short":
            return out[:, :, :-1], lse
        if self.lie == "lse_transposed":
            return out, lse.T.contiguous()
        if self.lie == "dtype":
            return out.double(), lse
        if self.lie == "strided":
            return out.transpose(0, 1).contiguous().transpose(0, 1), lse
        if self.lie == "copy":
            return out.clone(), lse
        return out


@pytest.fixture
def liar():
    backend = _Liar()

    class Plugin:
        @mla_core.hookimpl
        def mla_core_backends(self):
            return [backend]

    mla_core.register_plugin(Plugin(), "liar")
    yield backend
    plugins.reload()


@pytest.mark.parametrize("lie,words", [("short", "shape"), ("lse_transposed", "shape"), ("dtype", "dtype"),
                                       ("strided", "contiguous"), ("not_a_tuple", "tuple")])
def test_wrong_result_is_an_error_naming_the_backend(liar, lie, words, monkeypatch):
    liar.lie = lie
    with pytest.raises(BackendOutputError, match=f"tt_liar.*{words}"):
        mla_core.merge_attn_states(**_merge_args())
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")  # serving: no result checks (documented)
    if lie != "not_a_tuple":
        mla_core.merge_attn_states(**_merge_args())
        with result_checks(), pytest.raises(BackendOutputError):  # `mla-core check` always checks
            mla_core.merge_attn_states(**_merge_args())


def test_given_output_buffer_must_be_written_in_place(liar):
    liar.lie = "copy"
    args = _merge_args()
    with pytest.raises(BackendOutputError, match="in place"):
        mla_core.merge_attn_states(**args, output=torch.empty(64, 4, 32))


def test_result_checks_are_skipped_while_compiling(liar, monkeypatch):
    liar.lie = "short"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    problem, call = mla_core.specs.validate_merge(**_merge_args(), output=None, output_lse=None)
    out, _ = liar.run(problem, call, {})
    assert out.shape[-1] == 31


# --------------------------------------------------------------------------------------------------
# item 8: cache export / import


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="mla-core")
    cli_autotune.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def test_export_refuses_to_overwrite_and_never_follows_a_symlink(fake_world, tmp_path, capsys):
    cache.store("cpu", {fakes.merge_problem().key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    target = tmp_path / "out.json"
    target.write_text("precious")
    assert _cli("cache", "export", str(target), "--device", "cpu") == 2
    assert "--force" in _one_line_error(capsys) and target.read_text() == "precious"
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    assert _cli("cache", "export", str(link), "--device", "cpu") == 2
    assert "symbolic link" in _one_line_error(capsys)
    assert _cli("cache", "export", str(link), "--device", "cpu", "--force") == 0
    assert victim.read_text() == "not yours" and not link.is_symlink()  # the link itself was replaced
    assert cache.load_export(link.read_text())[1]
    assert _cli("cache", "export", str(target), "--device", "cpu", "--force") == 0
    assert json.loads(target.read_text())["format"] == "mla_core-autotune"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_export_errors_are_one_line(fake_world, tmp_path, capsys):
    assert _cli("cache", "export", str(tmp_path / "out.json"), "--device", "cpu") == 1  # nothing cached
    assert "nothing written" in _one_line_error(capsys) and not (tmp_path / "out.json").exists()
    cache.store("cpu", {fakes.merge_problem().key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    assert _cli("cache", "export", str(tmp_path / "missing" / "out.json"), "--device", "cpu") == 2
    assert "does not exist" in _one_line_error(capsys)
    assert _cli("cache", "export", str(tmp_path), "--device", "cpu") == 2
    assert "is a folder" in _one_line_error(capsys)


def test_import_rejects_invalid_entries_and_malformed_keys(fake_world, tmp_path, capsys):
    good = fakes.merge_problem().key()
    bad_config = fakes.merge_problem(tokens=8).key()
    exported = tmp_path / "in.json"
    exported.write_text(json.dumps({"format": "mla_core-autotune", "schema": 1, "device": "cpu", "entries": {
        good: _entry(fake_world["tt_fast"], {"sleep_s": 0.001}),
        bad_config: _entry(fake_world["tt_fast"], {"sleep_s": 0}),
        "no-bar-in-this-key": _entry(fake_world["tt_fast"], {"sleep_s": 0.001})}}))
    assert _cli("cache", "import", str(exported)) == 1
    err = capsys.readouterr().err
    assert "rejected" in err and bad_config in err and "no-bar-in-this-key" in err
    assert set(cache.user_entries("cpu")) == {good}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert _cli("cache", "import", str(fifo)) == 2
    assert "not a regular file" in _one_line_error(capsys)


def test_malformed_key_on_disk_cannot_break_sync(fake_world):
    path = _write_user_file({})
    data = json.loads(path.read_text())
    data["entries"]["nobar"] = _entry(fake_world["tt_fast"])
    data["entries"][fakes.merge_problem().key()] = _entry(fake_world["tt_fast"], {"sleep_s": 0.001})
    path.write_text(json.dumps(data))
    with pytest.warns(cache.CacheWarning, match="skipped"):
        choices = tuner._local_choices()  # what sync sends: must not raise
    assert list(choices) == [fakes.merge_problem().key()]
    with pytest.warns(tuner.AutotuneWarning, match="nobar"):
        assert tuner.install({"nobar": _entry(fake_world["tt_fast"])}) == 0
