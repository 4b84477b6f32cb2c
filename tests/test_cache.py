"""The on-disk autotune cache: format, merging, 8 concurrent writers, corrupt files, unwritable folders, CLI."""
import argparse
import json
import os
import subprocess
import sys
import textwrap

import pytest

import autotune_fakes as fakes
import mla_core
from mla_core import dispatch
from mla_core.autotune import cache
from mla_core.cli import autotune as cli_autotune

TESTS = os.path.dirname(__file__)


def _entry(backend, config=None):
    return {"backend": backend.name, "config": config or {}, "versions": cache.versions(backend, "cpu")}


def _key(tokens: int) -> str:
    """A well-formed problem key (malformed keys are skipped)."""
    return fakes.merge_problem(tokens=tokens).key()


def test_default_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("MLA_CORE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.user_dir() == tmp_path / "mla_core"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert str(cache.user_dir()).endswith(os.path.join(".cache", "mla_core"))
    assert cache.file_name("NVIDIA H200") == "NVIDIA_H200.json"


def test_store_merges_and_file_is_readable_json(fake_world):
    a, b = fakes.merge_problem(tokens=8).key(), fakes.merge_problem(tokens=16).key()
    assert cache.store("cpu", {a: _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
    assert cache.store("cpu", {b: _entry(fake_world["tt_slow"])})
    data = json.loads(cache.user_file("cpu").read_text())
    assert data["format"] == "mla_core-autotune" and data["schema"] == 1 and data["device"] == "cpu"
    assert set(data["entries"]) == {a, b} and data["entries"][a]["config"] == {"sleep_s": 0.001}
    assert data["entries"][a]["versions"]["mla_core"] == mla_core.__version__
    assert not [p for p in cache.user_dir().iterdir() if p.name.endswith(".tmp")]  # no temporary left behind


@pytest.mark.parametrize("garbage", ["{\"format\": \"mla_core-autotune\", \"schema\": 1, \"entr",  # truncated
                                     "\x00\x01 not json at all", "[1, 2, 3]"])
def test_corrupt_file_is_reported_moved_aside_and_never_fatal(fake_world, garbage):
    path = cache.user_file("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(garbage)
    with pytest.warns(cache.CacheWarning, match="unreadable"):
        out, lse = mla_core.merge_attn_states(**_merge_args())  # dispatch reads the cache on this miss
    assert out.shape == (64, 4, 32)
    assert dispatch.choose(fakes.merge_problem()).source == "priority"
    assert not path.exists() and len(list(path.parent.glob("cpu.json.corrupt-*"))) == 1
    assert cache.store("cpu", {_key(8): _entry(fake_world["tt_fast"])}) and _key(8) in cache.user_entries("cpu")


def _merge_args():
    import torch
    g = torch.Generator().manual_seed(3)
    return dict(prefix_output=torch.randn(64, 4, 32, generator=g), prefix_lse=torch.randn(4, 64, generator=g),
                suffix_output=torch.randn(64, 4, 32, generator=g), suffix_lse=torch.randn(4, 64, generator=g))


def test_invalid_entries_are_skipped(fake_world):
    path = cache.user_file("cpu")
    path.parent.mkdir(parents=True)
    good = _entry(fake_world["tt_fast"])
    path.write_text(json.dumps({"format": "mla_core-autotune", "schema": 1, "device": "cpu",
                                "entries": {_key(8): good, _key(16): {"backend": 3}, _key(32): "x",
                                            _key(64): {**good, "config": {"block_h": {"nested": 1}}},
                                            "merge": good, "merge|cpu|tokens=08": good, "nope|cpu": good}}))
    with pytest.warns(cache.CacheWarning, match="6 entries skipped"):
        assert cache.user_entries("cpu") == {_key(8): good}


def test_unwritable_directory_degrades_to_memory_with_one_warning(fake_world, monkeypatch, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(blocker / "mla_core"))  # mkdir fails: the parent is a file
    problem = fakes.merge_problem()
    with pytest.warns(cache.CacheWarning, match="not writable") as caught:
        assert not cache.store("cpu", {problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001})})
        assert not cache.store("cpu", {_key(8): _entry(fake_world["tt_slow"])})
    assert len([w for w in caught if "not writable" in str(w.message)]) == 1
    choice = dispatch.choose(problem)  # the in-memory store still answers lookups
    assert (choice.backend.name, choice.config, choice.source) == ("tt_fast", {"sleep_s": 0.001}, "cache")


def test_read_only_directory(fake_world, monkeypatch, tmp_path):
    """A folder where writes fail (read-only mount, no permission): one warning, choices kept in memory.

    chmod cannot make a folder read-only for root (CI runs as root), so the failure is injected where the
    cache creates its files: the lock file and the temporary file both go through os.open.
    """
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path))
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(13, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_open)
    with pytest.warns(cache.CacheWarning, match="not writable") as caught:
        assert not cache.store("cpu", {_key(8): _entry(fake_world["tt_fast"])})
        assert not cache.store("cpu", {_key(16): _entry(fake_world["tt_fast"])})
    assert len([w for w in caught if "not writable" in str(w.message)]) == 1
    assert {_key(8), _key(16)} <= set(cache.user_entries("cpu"))


WRITER = textwrap.dedent("""
    import sys, warnings
    sys.path.insert(0, {tests!r})
    import autotune_fakes as fakes
    from mla_core.autotune import cache, tuner
    from mla_core.plugins import registry
    i = int(sys.argv[1])
    fk = fakes.install()
    registry().backends.clear(); registry().backends.update(fk)
    warnings.simplefilter("ignore")
    result = tuner.tune(fakes.merge_problem(tokens=2 ** (i + 1)), [fk["tt_slow"], fk["tt_fast"]], reference="tt_exact",
                           warmup=1, repeats=3)
    assert tuner.record(result)
    for j in range(5):
        cache.store("cpu", {{f"merge|cpu|j={{j}}|writer={{i}}": result.entry()}})
""")


def test_eight_processes_writing_at_once_lose_nothing(tmp_path):
    env = {**os.environ, "MLA_CORE_CACHE_DIR": str(tmp_path / "shared"), "TRITON_INTERPRET": "1"}
    script = WRITER.format(tests=TESTS)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], env=env, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(errors)
    entries = json.loads((tmp_path / "shared" / "cpu.json").read_text())["entries"]
    want = {fakes.merge_problem(tokens=2 ** (i + 1)).key() for i in range(8)}
    want |= {f"merge|cpu|j={j}|writer={i}" for i in range(8) for j in range(5)}
    assert set(entries) == want
    assert all(entries[k]["backend"] == "tt_fast" for k in want)


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="mla-core")
    cli_autotune.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_cache_cli_show_export_clear_import(fake_world, tmp_path, capsys):
    problem = fakes.merge_problem()
    cache.store("cpu", {problem.key(): _entry(fake_world["tt_fast"], {"sleep_s": 0.001}),
                        _key(8): {**_entry(fake_world["tt_slow"]), "versions": {"torch": "0.1"}}})
    assert _cli("cache", "show", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    rows = {r["problem"]: r for r in shown["devices"]["cpu"]["entries"]}
    assert rows[problem.key()]["current"] and not rows[_key(8)]["current"]
    assert _cli("cache", "show") == 0
    text = capsys.readouterr().out
    assert "tt_fast" in text and "stale" in text
    exported = tmp_path / "export.json"
    assert _cli("cache", "export", str(exported), "--device", "cpu") == 0
    assert "exported 2 entries" in capsys.readouterr().out
    assert _cli("cache", "clear", "--json") == 0
    assert json.loads(capsys.readouterr().out)["removed"] == [str(cache.user_file("cpu"))]
    assert cache.user_entries("cpu") == {}
    assert _cli("cache", "import", str(exported), "--json") == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 2
    assert set(cache.user_entries("cpu")) == {problem.key(), _key(8)}
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert _cli("cache", "import", str(bad)) == 2


def test_shipped_h200_file_is_valid_and_names_real_configs(recwarn):
    """The shipped choices parse without a warning, name loaded backends and keys that round-trip."""
    import mla_core
    from mla_core.problem import Problem
    entries = cache.shipped_entries("NVIDIA H200")
    assert len(entries) >= 40 and not recwarn.list
    for key, entry in entries.items():
        problem = Problem.from_key(key)
        assert problem.key() == key and problem.device == "cuda"
        assert entry["backend"] in mla_core.backends() and entry["versions"]["device"] == "NVIDIA H200"
        assert entry["backend"] != "reference", "a shipped choice never sends users to the slow reference"


def test_store_refuses_malformed_keys_and_entries_with_a_warning(fake_world):
    good = _entry(fake_world["tt_fast"])
    with pytest.warns(cache.CacheWarning, match="2 entries not stored"):
        assert cache.store("cpu", {_key(8): good, "no-bar": good, _key(16): {**good, "config": "x"}})
    assert set(json.loads(cache.user_file("cpu").read_text())["entries"]) == {_key(8)}
