"""The README's quickstart runs as written."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU user's machine: the reference backend serves
    from mla_core import dispatch
    dispatch.clear_memory()
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    scope: dict = {}
    exec(compile(blocks[0], str(README), "exec"), scope)
    assert tuple(scope["out"].shape) == (2, 16, 512) and tuple(scope["lse"].shape) == (2, 16)
    assert not scope["out"].float().isnan().any() and not scope["out_q"].float().isnan().any()
    dispatch.clear_memory()
