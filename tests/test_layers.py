"""The core stays layered: no import circle among mla_core's modules, and dispatch never imports the tuner or CLI."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "mla_core"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: pathlib.Path, modules, module_level_only: bool) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    if module_level_only:
        top = set()
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.If, ast.Try)):
                top.update(n for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom)))
        nodes = [n for n in nodes if n in top]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
            continue
        base = package
        for _ in range(max(0, node.level - 1)):
            base = base.rsplit(".", 1)[0]
        target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
        for alias in node.names:
            found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return {m for m in found if m in modules and m != name}


def test_no_import_circle_among_core_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules, True) - {"mla_core"} for name, path in modules.items()}
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for dep in graph[node]:
            assert state.get(dep) != 1, "import circle: " + " -> ".join(stack[stack.index(dep):] + [dep])
            if dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_dispatch_and_plugins_import_no_layer_above_them():
    modules = _modules()
    for low in ("mla_core.dispatch", "mla_core.plugins", "mla_core.specs", "mla_core.backend", "mla_core.numerics"):
        deps = _imports(low, modules[low], modules, module_level_only=False)
        above = {d for d in deps if d.startswith(("mla_core.autotune", "mla_core.cli", "mla_core.ops"))}
        assert not above, f"{low} imports {sorted(above)}"
