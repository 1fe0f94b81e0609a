"""The import graph of `src/gpuplane`, read with `ast` (every import counts: those inside
functions and under `if TYPE_CHECKING:` too), the tier rules it is held to, and a report of its
shape. Standard library only, so it reads any checkout, an old one included:

    python tests/tiers.py [SRC]    # SRC: a `src/gpuplane` directory; default: this checkout's

prints the modules per package, the modules at control's root, the cross-package imports and
the import floors (the longest chain of imports). `tests/test_tiers.py` holds the rules."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuplane"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

# The one circle by design: the scheduler's policy registry loads the policies (lazily, at
# first use), and each policy imports the registry to register itself by decorator.
REGISTRY_LOAD = ("gpuplane.control.scheduler.registry", "gpuplane.control.scheduler.policies")

# tier -> the tiers it must not import (a tier: the first package under gpuplane)
FORBIDDEN = {
    "serve": ("control", "audit", "batch", "console"),
    "control": ("serve", "audit", "batch", "console"),
    # the engines floor knows only the shared root and itself (config.py assembles every tier)
    "engines": ("serve", "control", "audit", "batch", "console", "cli", "plane", "config"),
}


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement's edge: `source` imports `target`, at `path`:`line`."""

    source: str
    target: str
    path: Path
    line: int

    def where(self, root: Path) -> str:
        return f"src/gpuplane/{self.path.relative_to(root)}:{self.line}"


def module_name(path: Path, root: Path) -> str:
    parts = ["gpuplane", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = SRC) -> dict[str, Path]:
    """Every module under `root` by dotted name (a package by its `__init__.py`)."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module `name` names: itself, else its longest known prefix (an attribute of one)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.Import | ast.ImportFrom, source: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the importing module's package, `level` steps up
        package = source.split(".") if is_package else source.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}"  # a submodule if it is one, else resolved to `base`


def imports(root: Path = SRC) -> list[Import]:
    """Every import of one gpuplane module by another, lazy and TYPE_CHECKING ones included."""
    known = modules(root)
    out = []
    for source, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _targets(node, source, is_package):
                target = _resolve(name, known)
                if target is not None and target != source:
                    out.append(Import(source, target, path, node.lineno))
    return list(dict.fromkeys(out))  # `from m import a, b`: one edge to m, not two


def tier(module: str) -> str:
    """`serve`, `control`, `engines`, ... or the shared root's module (`resources`, `errors`)."""
    return module.split(".")[1] if "." in module else module


def package(module: str, known: dict[str, Path]) -> str:
    """The package a module belongs to: itself for a package, else its parent."""
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def crossings(edges: list[Import]) -> list[tuple[Import, str]]:
    """The imports from serve, control or engines into a tier they must not know."""
    return [
        (e, f"{tier(e.source)} must not import {tier(e.target)}")
        for e in edges
        if tier(e.target) in FORBIDDEN.get(tier(e.source), ())
    ]


def private_reaches(edges: list[Import]) -> list[tuple[Import, str]]:
    """Imports of a private module (`_name`) from outside the package that holds it."""
    out = []
    for e in edges:
        parts = e.target.split(".")
        private = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
        if private is None:
            continue
        owner = ".".join(parts[:private])
        if e.source != owner and not e.source.startswith(owner + "."):
            out.append((e, f"{e.target} is private to {owner}"))
    return out


def graph(edges: list[Import], known: dict[str, Path]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {m: set() for m in known}
    for e in edges:
        if not (e.source == REGISTRY_LOAD[0] and e.target.startswith(REGISTRY_LOAD[1])):
            out[e.source].add(e.target)
    return out


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def floors(g: dict[str, set[str]], within: set[str] | None = None) -> int:
    """The longest chain of imports, in modules (a circle counts as one floor)."""
    nodes = set(g) if within is None else within
    sub = {m: g[m] & nodes for m in nodes}
    comp = {m: m for m in nodes}
    for circle in circles(sub):
        comp.update({m: circle[0] for m in circle})
    dag: dict[str, set[str]] = {comp[m]: set() for m in nodes}
    for m in nodes:
        dag[comp[m]] |= {comp[d] for d in sub[m]} - {comp[m]}
    depth: dict[str, int] = {}

    def visit(c: str) -> int:
        if c not in depth:
            depth[c] = 1 + max((visit(d) for d in dag[c]), default=0)
        return depth[c]

    return max(map(visit, dag), default=0)


@dataclass(frozen=True, slots=True)
class Oversize:
    """A module over `MAX_MODULE_LINES` or a function over `MAX_FUNCTION_LINES`."""

    key: str  # the module, or module:function
    path: Path
    line: int
    lines: int


def oversize(root: Path = SRC) -> list[Oversize]:
    """Modules and functions past their limits; migrations aside (written once, never read)."""
    out = []
    for name, path in modules(root).items():
        if ".migrations." in f"{name}.":
            continue
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            out.append(Oversize(name, path, 1, n))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(Oversize(f"{name}:{node.name}", path, node.lineno, length))
    return out


def report(root: Path = SRC) -> str:
    known = modules(root)
    edges = imports(root)
    g = graph(edges, known)
    per_package = Counter(package(m, known) for m, p in known.items() if p.name != "__init__.py")
    control_root = {
        m for m, p in known.items() if m.count(".") == 2 and m.startswith("gpuplane.control.")
    }
    control_root = {m for m in control_root if known[m].name != "__init__.py"}
    pairs = {(e.source, e.target) for e in edges}
    cross_tier = {(s, t) for s, t in pairs if tier(s) != tier(t)}
    cross_package = {(s, t) for s, t in pairs if package(s, known) != package(t, known)}
    lines = [f"modules: {sum(per_package.values())} (packages: {len(per_package)})"]
    lines += [f"  {pkg:<44} {n:>3}" for pkg, n in sorted(per_package.items())]
    lines += [
        f"modules at control's root: {len(control_root)}",
        f"imports (distinct module pairs): {len(pairs)}",
        f"  across tiers (serve, control, engines, cli, ..., the shared root): {len(cross_tier)}",
        f"  across packages (importer and imported in two directories): {len(cross_package)}",
        f"import floors (longest import chain, modules): all of src {floors(g)}; "
        f"control's root alone {floors(g, control_root)}",
        f"import circles (the policy registry's aside): {len(circles(g))}",
        f"modules over {MAX_MODULE_LINES} lines, functions over {MAX_FUNCTION_LINES}: "
        f"{sum(':' not in o.key for o in oversize(root))}, "
        f"{sum(':' in o.key for o in oversize(root))}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else SRC))
