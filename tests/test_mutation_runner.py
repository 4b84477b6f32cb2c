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


def test_gpu_mutant_whose_tests_select_nothing_survives(tmp_path, capsys):
    body = "a = x * k * 2\n"
    root = _checkout(tmp_path, body)
    mutant = dict(file="pkg/mod.py", old="x * k * 2", new="x * k * 3", why="a wrong constant", gpu=True)
    assert gpu_mutants.run([mutant], lambda m: ["-p", "no:cacheprovider", "test_mod.py", "-k", "nothing"],
                           root=root, work=tmp_path / "work") == 1
    assert "SURVIVED" in capsys.readouterr().out
    assert (root / "pkg" / "mod.py").read_text() == body


def test_cpu_mutant_without_gpu_tests_is_left_to_the_cpu_runner(tmp_path, capsys):
    body = "a = x * k * 2\n"
    root = _checkout(tmp_path, body)
    cpu = dict(file="pkg/mod.py", old="x * k * 2", new="x * k * 3", why="a wrong constant")
    gpu = dict(file="pkg/mod.py", old="x * k * 2", new="x * 2", why="drops the factor k", gpu=True)
    selections = {"a wrong constant": ["-k", "nothing"], "drops the factor k": []}
    assert gpu_mutants.run([cpu, gpu], lambda m: ["-p", "no:cacheprovider", "test_mod.py", *selections[m["why"]]],
                           root=root, work=tmp_path / "work") == 0
    out = capsys.readouterr().out
    assert "mutant 0 (a wrong constant...): not judged here" in out and "1/1 killed (1 not judged here)" in out
    assert (root / "pkg" / "mod.py").read_text() == body


def test_a_hanging_mutant_is_killed_by_the_timeout_and_the_file_restored(tmp_path, capsys, monkeypatch):
    body = "a = x * k * 2\n"
    root = _checkout(tmp_path, body)
    (root / "test_hang.py").write_text(
        "import pathlib, time, pytest\n"
        "@pytest.mark.gpu\n"
        "def test_waits_for_a_barrier():\n"
        "    while 'x * k * 2' not in pathlib.Path(__file__).with_name('pkg').joinpath('mod.py').read_text():\n"
        "        time.sleep(0.05)\n")
    monkeypatch.setenv("MUTANT_TIMEOUT", "3")
    mutant = dict(file="pkg/mod.py", old="x * k * 2", new="x * 2", why="a dropped barrier: the kernel hangs")
    assert gpu_mutants.run([mutant], lambda m: ["-p", "no:cacheprovider", "test_hang.py"], root=root,
                           work=tmp_path / "work") == 0
    out = capsys.readouterr().out
    assert "killed [timed out after 3 s" in out and "1/1 killed" in out
    assert (root / "pkg" / "mod.py").read_text() == body


def test_mutant_indices_judge_only_those(tmp_path, capsys, monkeypatch):
    body = "a = x * k * 2\n"
    root = _checkout(tmp_path, body)
    survivor = dict(file="pkg/mod.py", old="a = ", new="a  = ", why="a mutant the test cannot see")
    killed = dict(file="pkg/mod.py", old="x * k * 2", new="x * 2", why="drops the factor k")
    monkeypatch.setenv("MUTANT_INDICES", "1")
    assert gpu_mutants.run([survivor, killed], lambda m: ["-p", "no:cacheprovider", "test_mod.py"], root=root,
                           work=tmp_path / "work") == 0
    out = capsys.readouterr().out
    assert "mutant 1 (drops" in out and "mutant 0" not in out and "1/1 killed" in out


def test_every_mutant_still_names_its_line():
    """Every mutant of every list (the CPU ones and the CUDA ones the device runs) names text that occurs exactly
    once in its file: moving code a mutant targets must move the mutant too, found here rather than on the GPU."""
    import run as mutation_run
    problems = [f"{m.id} ({m.file}): {'; '.join(m.problems)}" for m in mutation_run.load_mutants() if m.problems]
    assert not problems, problems
