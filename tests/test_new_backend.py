"""`mla-core new-backend NAME`: the skeleton installs and passes its own tests untouched; examples/plugin is it."""
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from mla_core import cli
from mla_core.cli.new_backend import files

ROOT = Path(__file__).resolve().parents[1]


def test_examples_plugin_is_the_generated_skeleton():
    for rel, text in files("example").items():
        assert (ROOT / "examples" / "plugin" / rel).read_text() == text, (
            f"examples/plugin/{rel} differs from the skeleton: regenerate it with "
            "`mla-core new-backend example --dir examples/plugin --force`")


def test_generated_skeleton_installs_and_passes_its_own_tests(tmp_path, capsys):
    """CI's proof: generate, pip install -e (into a venv layered over this environment), run the skeleton's pytest."""
    folder = tmp_path / "mla-core-ci-skeleton"
    assert cli.main(["new-backend", "ci_skeleton", "--dir", str(folder)]) == 0
    assert "pip install -e" in capsys.readouterr().out
    # A venv of its own sees this environment's packages (mla_core, torch, pytest) through a .pth file, so the
    # plugin's entry point is visible only there, even when this environment is itself a venv.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    own_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    Path(own_site, "_outer_environment.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in outer))
    pip = [sys.executable, "-m", "pip", "--python", python]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a plugin author's shell has it
    try:
        subprocess.run(pip + ["install", "-q", "--no-deps", "--no-build-isolation", "-e", str(folder)], check=True,
                       capture_output=True, text=True, timeout=120)
        done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "3 passed" in done.stdout
        listed = subprocess.run([python, "-m", "mla_core.cli", "backends"], env=env, capture_output=True, text=True,
                                timeout=120)
        assert "ci_skeleton" in listed.stdout
    finally:
        subprocess.run(pip + ["uninstall", "-q", "-y", "mla-core-ci-skeleton"], capture_output=True, timeout=120)


@pytest.mark.parametrize("argv, needle", [(["new-backend", "My-HW"], "needs a lowercase identifier"),
                                          (["new-backend", "ok", "--dir", "{tmp}"], "is not empty")])
def test_bad_name_or_occupied_folder_is_one_line(tmp_path, capsys, argv, needle):
    (tmp_path / "something").write_text("x")
    code = cli.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err
