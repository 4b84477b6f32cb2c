"""``mla-core new-backend NAME [--dir DIR]``: write a working backend plugin package to start from.

The skeleton is a complete plugin: ``pyproject.toml`` with the ``mla_core`` entry point, a backend class that
implements ``merge_attn_states`` in plain PyTorch, and a test calling :func:`mla_core.testing.check_backend`.
``pip install -e DIR && pytest DIR`` passes untouched (CI proves it); ``examples/plugin`` is this skeleton for
the name ``example``.
"""
from __future__ import annotations

import re
from pathlib import Path

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "mla-core-{dist}"
version = "0.1.0"
description = "An mla_core backend plugin: {name}"
requires-python = ">=3.10"
dependencies = ["mla-core"]

# This is the whole registration: mla_core loads every entry point in the group "mla_core".
[project.entry-points.mla_core]
{name} = "mla_core_{name}"

[tool.setuptools]
packages = ["mla_core_{name}"]

[tool.pytest.ini_options]
testpaths = ["tests"]
'''

README = '''\
# mla-core-{dist}

An [mla_core](https://pypi.org/project/mla-core/) backend plugin, started from `mla-core new-backend {name}`.

```bash
pip install -e .          # registers the entry point: `mla-core backends` lists `{name}`
pytest                    # the conformance suite (mla_core.testing.check_backend) against the reference backend
mla-core check --backend {name}
```

`mla_core_{name}/__init__.py` implements `merge_attn_states` in plain PyTorch. To add an op, declare it in
`capabilities` (the keys and features you may name are in mla_core's docs/plugins.md) and add the method named
after it (`decode`, `prefill`, `merge`, `rope_quantize_fp8`, `sparse_decode`); the conformance test then runs
it on awkward shapes against the reference.
'''

PACKAGE = '''\
"""An mla_core backend plugin: ``merge_attn_states`` in plain PyTorch.

``pip install -e .`` registers it (entry point group ``mla_core`` in pyproject.toml); then
``mla-core backends`` lists ``{name}`` and ``mla_core.merge_attn_states(..., backend="{name}")`` runs it.
"""
from __future__ import annotations

import torch

import mla_core
from mla_core.specs import MergeCall

_FLOAT_DTYPES = {{"bfloat16", "float16", "float32"}}


class {cls}(mla_core.Backend):
    """Merges two partial attention results by their log-sum-exp, in float32 on the CPU."""

    name = "{name}"
    version = "0.1.0"  # bump when results or speed change: autotune cache entries record it
    # Dispatch runs the valid backend with the highest priority when nothing is tuned (reference 0, musa_fp8
    # 150, triton 200, cuda 300). Below 0: used only when asked for by name (backend="{name}") or tuned.
    priority = -10
    device_types = frozenset({{"cpu"}})
    description = "{name}: merge_attn_states in plain PyTorch"
    # Per op: the Problem values supported (a parameter not named is unrestricted) and the optional
    # features supported. merge has no features; decode, e.g., has "lse" and "fp32_q".
    capabilities = {{"merge": mla_core.OpCapability(limits={{"dtype": _FLOAT_DTYPES, "out_dtype": _FLOAT_DTYPES}})}}

    def merge(self, call: MergeCall, config: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """``lse = log(exp(a) + exp(b))``, ``output = exp(a - lse) * prefix + exp(b - lse) * suffix``.

        call.prefix_output / call.suffix_output: [tokens, heads, dim]; call.prefix_lse / call.suffix_lse:
        [heads, tokens] float32 (natural log). An LSE of -inf (mla_core) or +inf (FlashAttention, vLLM) marks
        an empty state that contributes nothing; two empty states give output 0 and LSE -inf. Writes into
        call.output / call.output_lse when given and returns them, else returns new contiguous tensors.
        """
        a, b = (torch.where(x == float("inf"), float("-inf"), x.float()) for x in (call.prefix_lse, call.suffix_lse))
        lse = torch.logaddexp(a, b)                                  # [heads, tokens]; -inf when both are empty
        finite = torch.where(torch.isinf(lse), 0.0, lse)
        w_prefix = torch.exp(a - finite).t()[..., None]              # [tokens, heads, 1]; 0 for an empty state
        w_suffix = torch.exp(b - finite).t()[..., None]
        merged = w_prefix * call.prefix_output.float() + w_suffix * call.suffix_output.float()
        output = call.output if call.output is not None else torch.empty_like(call.prefix_output,
                                                                               memory_format=torch.contiguous_format)
        output_lse = call.output_lse if call.output_lse is not None else torch.empty_like(
            lse, memory_format=torch.contiguous_format)
        output.copy_(merged)
        output_lse.copy_(lse)
        return output, output_lse


@mla_core.hookimpl
def mla_core_backends():
    return [{cls}()]
'''

TEST = '''\
"""The {name} backend against mla_core's reference: the conformance suite, and the public op through dispatch."""
import torch

import mla_core
from mla_core.testing import check_backend


def test_installed_through_the_entry_point():
    assert "{name}" in mla_core.backends(), "install the plugin first: pip install -e ."


def test_conformance():
    """Every declared op on awkward shapes, poisoned buffers, empty rows, every config (raises with a report)."""
    report = check_backend("{name}")
    assert report.counts()["pass"] > 0


def test_public_op_runs_on_this_backend():
    torch.manual_seed(0)
    tokens, heads, dim = 7, 2, 16
    args = dict(prefix_output=torch.randn(tokens, heads, dim), prefix_lse=torch.randn(heads, tokens),
                suffix_output=torch.randn(tokens, heads, dim), suffix_lse=torch.randn(heads, tokens))
    out, lse = mla_core.merge_attn_states(**args, backend="{name}")
    ref, ref_lse = mla_core.merge_attn_states(**args, backend="reference")
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
'''


def files(name: str) -> dict[str, str]:
    """The skeleton's files (relative path -> text) for backend ``name``."""
    cls = "".join(part.capitalize() for part in name.split("_")) + "Backend"
    fill = dict(name=name, dist=name.replace("_", "-"), cls=cls)
    return {"pyproject.toml": PYPROJECT.format(**fill), "README.md": README.format(**fill),
            f"mla_core_{name}/__init__.py": PACKAGE.format(**fill), "tests/test_conformance.py": TEST.format(**fill)}


def write_skeleton(name: str, folder: Path, force: bool = False) -> list[Path]:
    """Write the skeleton of backend ``name`` into ``folder``; returns the files written.

    Raises ValueError for a name that is not a lowercase identifier and FileExistsError for a folder that
    holds files, unless ``force`` (then the skeleton's files are overwritten, others left alone).
    """
    if not NAME_RE.match(name):
        raise ValueError(f"NAME: got {name!r}, needs a lowercase identifier (letters, digits, _; e.g. myhw); it "
                         "becomes the backend name, the package mla_core_NAME and the distribution mla-core-NAME")
    if folder.exists() and any(folder.iterdir()) and not force:
        raise FileExistsError(f"{folder} is not empty; choose another --dir, or pass --force to overwrite the "
                              "skeleton's files there")
    written = []
    for rel, text in files(name).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def cmd_new_backend(args) -> int:
    folder = Path(args.dir) if args.dir else Path(f"mla-core-{args.name.replace('_', '-')}")
    written = write_skeleton(args.name, folder, args.force)
    print(f"wrote the {args.name!r} backend plugin to {folder}:")
    for path in written:
        print(f"  {path}")
    print(f"next: pip install -e {folder} && pytest {folder} && mla-core backends")
    return 0


def add_parser(subparsers) -> None:
    """Add ``new-backend`` to the ``mla-core`` subparsers."""
    p = subparsers.add_parser(
        "new-backend", help="write a working backend plugin package (entry point, backend class, conformance test)",
        description="Writes a plugin package: pyproject.toml with the mla_core entry point, a backend class "
                    "implementing merge_attn_states in plain PyTorch, and a test running the conformance suite "
                    "(mla_core.testing.check_backend). `pip install -e DIR && pytest DIR` passes as written.")
    p.add_argument("name", help="backend name, a lowercase identifier (the package becomes mla_core_NAME)")
    p.add_argument("--dir", help="folder to write (default: ./mla-core-NAME); must be empty unless --force")
    p.add_argument("--force", action="store_true", help="overwrite the skeleton's files in a non-empty folder")
    p.set_defaults(func=cmd_new_backend)
