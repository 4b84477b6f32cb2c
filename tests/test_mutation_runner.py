"""The GPU mutant runner (tests/mutation/gpu_mutants.py) on a Python mutant, runnable anywhere: the mutant is in
place while its tests run, and the file comes back byte for byte, also where the mutant's text occurs
unmutated elsewhere in it (a reverse replace once rewrote such a line and broke the next device step)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "mutation"))
import gpu_mutants  # noqa: E402


def _checkout(tmp_path, body):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(body)
    (tmp_path / "test_mod.py").write_text(
        "import pytest, pathlib\n"
        "@pytest.mark.gpu\n"
        "def test_scale():\n"
        "    text = pathlib.Path(__file__).with_name('pkg').joinpath('mod.py').read_text()\n"
        "    assert 'a = x * k * 2' in text\n")
    return tmp_path


def test_python_mutant_applied_then_restored_exactly(tmp_path, capsys):
    body = "a = x * k * 2\nb = x * 2  # the mutant's text, unmutated\n"
    root = _checkout(tmp_path, body)
    mutant = dict(file="pkg/mod.py", old="x * k * 2", new="x * 2", why="drops the factor k")
    assert gpu_mutants.run([mutant], lambda m: ["-p", "no:cacheprovider", "test_mod.py"], root=root,
                           work=tmp_path / "work") == 0
    assert "1/1 killed" in capsys.readouterr().out
    assert (root / "pkg" / "mod.py").read_text() == body


def test_mutant_whose_tests_select_nothing_survives(tmp_path, capsys):
    body = "a = x * k * 2\n"
    root = _checkout(tmp_path, body)
    mutant = dict(file="pkg/mod.py", old="x * k * 2", new="x * k * 3", why="a wrong constant")
    assert gpu_mutants.run([mutant], lambda m: ["-p", "no:cacheprovider", "test_mod.py", "-k", "nothing"],
                           root=root, work=tmp_path / "work") == 1
    assert "SURVIVED" in capsys.readouterr().out
    assert (root / "pkg" / "mod.py").read_text() == body
