"""The control tier's modules import each other without a circle, counting every import: those
inside functions and under `TYPE_CHECKING` too. The scheduler core is left out (its policy
registry imports the policies that register with it, by design)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuplane.control

ROOT = Path(gpuplane.control.__file__).parent
SKIP = ("gpuplane.control.scheduler",)


def _module(path: Path) -> str:
    parts = ["gpuplane", "control", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The control modules `path` imports (a name imported from a package that is a submodule
    counts as that submodule)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
    return {m for m in out if m in modules}


def test_no_import_circle_in_the_control_tier() -> None:
    paths = {_module(p): p for p in ROOT.rglob("*.py")}
    modules = {m for m in paths if not m.startswith(SKIP)}
    graph = {m: _imports(paths[m], modules) - {m} for m in modules}
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            raise AssertionError("import circle: " + " -> ".join([*trail, module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*trail, module])
        done.add(module)

    for module in sorted(modules):
        visit(module, [])


def _all_imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top, inside functions and under `TYPE_CHECKING`."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def test_control_imports_neither_the_audit_nor_the_console() -> None:
    """The composition root (`plane.control_app`) mounts the audit's routes and the console on
    the control API; no control module reaches up to them, however lazily."""
    above = ("gpuplane.audit", "gpuplane.console")
    found = sorted(
        f"{_module(p)} imports {m}"
        for p in ROOT.rglob("*.py")
        for m in _all_imports(p)
        if m.startswith(above)
    )
    assert found == []
