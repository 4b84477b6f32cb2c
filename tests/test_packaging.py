"""The distribution ships every package of the source tree (an editable install hides a forgotten one)."""
import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {name: ROOT / path for name, path in config["package-dir"].items()}
    found = set()
    for name, folder in mapped.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join((name, *rel.parts)) if rel.parts else name)
    missing = sorted(found - listed)
    assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"


def test_a_built_wheel_holds_the_data_files_a_non_editable_install_needs(tmp_path):
    """A regular (non-editable) install gets the shipped autotune choices and the CUDA C++ sources (the cuda
    backend compiles them on first use; an editable install finds them in the checkout instead)."""
    import shutil
    import subprocess
    import zipfile

    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    for name in ("mla_core", "backends", "csrc", "autotune_cache"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    csrc = sorted(p.name for p in (ROOT / "csrc").iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp"))
    assert csrc, "csrc/ holds no sources"
    missing = [f"mla_core_cuda/csrc/{name}" for name in csrc if f"mla_core_cuda/csrc/{name}" not in names]
    shipped = sorted(p.name for p in (ROOT / "autotune_cache").glob("*.json"))
    missing += [f"mla_core/autotune_cache/{name}" for name in shipped if f"mla_core/autotune_cache/{name}" not in names]
    assert not missing, f"the wheel lacks {missing}"
