"""The architecture rules: the ragen library imports no orchestration (Prefect), tracking (MLflow) or versioning
(DVC) package, nor the pipeline (flows/, tasks/, servers/) or the command line (cli/), anywhere in a file (also inside
functions); and its packages import each other without cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "ragen"
FORBIDDEN = {"prefect", "mlflow", "dvc", "flows", "tasks", "servers", "cli"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in the file, at any depth."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, up level-1 packages
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def forbidden_imports(root: Path) -> list[str]:
    return [f"{p.relative_to(root.parent)}:{line} imports {name}"
            for p in sorted(root.rglob("*.py")) for line, name in imports_of(p, root)
            if name.split(".")[0] in FORBIDDEN]


def package_of(module: str) -> str:
    """The first-level package (or top-level module) a module belongs to: ragen.run.loop -> ragen.run."""
    return ".".join(module.split(".")[:2])


def package_cycles(root: Path) -> list[list[str]]:
    """Cycles in the import graph between the library's first-level packages (and top-level modules)."""
    edges: dict[str, set[str]] = defaultdict(set)
    top = root.name
    for p in root.rglob("*.py"):
        src = package_of(module_name(p, root))
        for _, name in imports_of(p, root):
            if name.split(".")[0] == top and name != top:
                dst = package_of(name)
                if dst != src:
                    edges[src].add(dst)
    cycles, done = [], set()
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    key = frozenset(path)
                    if key not in done:
                        done.add(key)
                        cycles.append([*path, start])
                elif nxt not in path and nxt > start:
                    stack.append((nxt, [*path, nxt]))
    return cycles


def test_ragen_imports_no_pipeline_anywhere():
    bad = forbidden_imports(LIBRARY)
    assert not bad, "the library must not import the pipeline or the CLI:\n" + "\n".join(bad)


def test_ragen_packages_have_no_import_cycle():
    cycles = package_cycles(LIBRARY)
    assert not cycles, "import cycles between ragen packages:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checks_see_what_they_look_for(tmp_path):
    """Both checks fail on a library that breaks the rules, even inside a function."""
    lib = tmp_path / "lib"
    for pkg in ("a", "b", "c"):
        (lib / pkg).mkdir(parents=True)
        (lib / pkg / "__init__.py").write_text("")
    (lib / "a" / "x.py").write_text("def f():\n    from prefect import flow\n    from lib.b import y\n")
    (lib / "b" / "y.py").write_text("from ..a import x\nimport lib.c\n")
    (lib / "c" / "z.py").write_text("import tasks.stages\n")
    assert forbidden_imports(lib) == ["lib/a/x.py:2 imports prefect", "lib/c/z.py:1 imports tasks.stages"]
    assert package_cycles(lib) == [["lib.a", "lib.b", "lib.a"]]


CHECK = """
import importlib, pkgutil, sys
import ragen
for m in pkgutil.walk_packages(ragen.__path__, "ragen."):
    importlib.import_module(m.name)
bad = sorted({n.split(".")[0] for n in sys.modules} & {"prefect", "mlflow", "dvc"})
print(",".join(bad))
"""


def test_importing_every_ragen_module_loads_no_pipeline_package():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "", f"ragen/ imported {out.stdout.strip()}"
