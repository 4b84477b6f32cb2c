"""Plugin loading: entry points, the example plugin, broken plugins, hook conformance."""
import importlib
import textwrap
from pathlib import Path

import pytest
import torch

import mla_core
from mla_core import inputs, plugins
from mla_core.accuracy import rel_l2

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A temporary site folder on sys.path where tests drop dist-info entry points; plugins reloaded after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    monkeypatch.undo()
    importlib.invalidate_caches()
    plugins.reload()


def _dist(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    importlib.invalidate_caches()


def test_builtin_backends_load_through_entry_points():
    names = set(mla_core.backends())
    assert {"reference", "triton", "cuda", "musa_fp8"} <= names
    ref = mla_core.get_backend("reference")
    assert {"decode", "prefill", "merge", "rope_quantize_fp8", "sparse_decode"} <= set(ref.capabilities)
    assert not plugins.registry().broken  # every built-in passes the registry's checks


def test_example_plugin_installs_by_entry_point_and_serves_merge(site, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    _dist(site, "mla_core_example", "[mla_core]\nexample = mla_core_example\n")
    plugins.reload()
    assert "example" in mla_core.backends()
    args = inputs.merge_inputs(23, heads=3, head_dim=16, dtype=torch.float32, seed=7)
    out = torch.full_like(args["prefix_output"], float("nan"))
    lse = torch.full_like(args["prefix_lse"], float("nan"))
    got, got_lse = mla_core.merge_attn_states(**args, output=out, output_lse=lse, backend="example")
    ref, ref_lse = mla_core.merge_attn_states(**args, backend="reference")
    assert got is out and got_lse is lse
    assert rel_l2(got, ref) < 1e-5 and rel_l2(got_lse, ref_lse) < 1e-5
    with mla_core.use_backend("example"):
        assert mla_core.merge_attn_states(**args)[0].data_ptr() != ref.data_ptr()


def test_plugin_that_fails_to_import_is_reported_and_others_keep_working(site):
    _dist(site, "broken_plugin", "[mla_core]\nbroken = mla_core_does_not_exist_anywhere\n")
    reg = plugins.reload()
    broken = {b.name: b.reason for b in reg.broken}
    assert "broken" in broken and "ModuleNotFoundError" in broken["broken"]
    assert "reference" in mla_core.backends()


def test_hook_implementation_matching_no_spec_is_rejected(site):
    (site / "mla_core_typo_plugin.py").write_text(textwrap.dedent("""
        import mla_core

        @mla_core.hookimpl
        def mla_core_backend():  # typo: the spec is mla_core_backends
            return []
    """))
    _dist(site, "typo_plugin", "[mla_core]\ntypo = mla_core_typo_plugin\n")
    reg = plugins.reload()
    broken = {b.name: b.reason for b in reg.broken}
    assert "typo" in broken and "matches no spec" in broken["typo"]


def test_hook_that_raises_or_returns_junk_is_reported():
    class Raises:
        @mla_core.hookimpl
        def mla_core_backends(self):
            raise RuntimeError("driver missing")

    class Junk:
        @mla_core.hookimpl
        def mla_core_backends(self):
            return ["not a backend"]

    try:
        assert mla_core.register_plugin(Raises(), "raises") == []
        assert mla_core.register_plugin(Junk(), "junk") == []
        broken = {b.name: b.reason for b in plugins.registry().broken}
        assert "driver missing" in broken["raises"]
        assert "not a mla_core.Backend" in broken["junk"]
    finally:
        plugins.reload()
