"""What the README claims of the code's shape, checked against the code: the layer order against the imports
(function-level imports included), no import cycle, evaluation independent of training, no function over 80
lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "retool_cli"
MAX_FUNCTION_LINES = 80


def module_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package (dotted, under the package's name) -> the package's modules it imports, at
    the top or inside a function. `from retool_cli.x import y` counts as importing retool_cli.x.y when that is
    a module, else retool_cli.x."""
    modules = {_dotted(p, package): p for p in package.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == package.name}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package.name:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
        out[name] = {m for m in found if m in modules and m != name}
    return out


def _dotted(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as its nodes in order (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def readme_layers() -> list[str]:
    """The packages of the README's layer list, lowest first."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("layers, lowest first (each a package") :].split("\n\n")[0]
    return re.findall(r"^\s{6}(\w+)/\s", block, flags=re.M)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""  # "" for a top-level module (config, files, runtime, ...)


def test_the_readme_layer_order_is_the_import_order() -> None:
    layers = readme_layers()
    assert set(layers) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} - {"commands"}
    upward = []
    for module, imported in module_imports().items():
        if package_of(module) not in layers:
            continue
        rank = layers.index(package_of(module))
        for target in imported:
            top = target.split(".")[1]
            # a layer imports lower layers and the shared top-level modules, never a higher layer or what opens a
            # run (the commands, the runtime, the command line)
            if top in layers[rank + 1 :] or top in ("commands", "runtime", "cli", "provenance"):
                upward.append(f"{module} imports {target}")
    assert not upward, "imports against the README's layer order:\n" + "\n".join(sorted(upward))


def test_no_import_cycle() -> None:
    cycle = find_cycle(module_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_evaluation_imports_nothing_of_training() -> None:
    imports = module_imports()
    found = [f"{m} imports {t}" for m, ts in imports.items() if package_of(m) in ("eval", "report") for t in ts]
    assert not [f for f in found if ".rl" in f.split(" imports ")[1]], found


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The graph and cycle finders on a package made here: a lazy import inside a function closes a circle."""
    pkg = tmp_path / "retool_cli"
    (pkg / "env").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "env" / "__init__.py").write_text("")
    (pkg / "env" / "a.py").write_text("from retool_cli.env import b\n")
    (pkg / "env" / "b.py").write_text("def f():\n    from retool_cli.env.a import x\n")
    (pkg / "c.py").write_text("import retool_cli.env.a\n")
    graph = module_imports(pkg)
    assert graph["retool_cli.env.a"] == {"retool_cli.env.b"} and graph["retool_cli.c"] == {"retool_cli.env.a"}
    assert find_cycle(graph) == ["retool_cli.env.a", "retool_cli.env.b", "retool_cli.env.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def long_functions(folder: Path, limit: int) -> list[str]:
    out = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_is_over_80_lines() -> None:
    found = long_functions(PACKAGE, MAX_FUNCTION_LINES) + long_functions(ROOT / "benchmarks", MAX_FUNCTION_LINES)
    assert not found, "split these:\n" + "\n".join(found)
