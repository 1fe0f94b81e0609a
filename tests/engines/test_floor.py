"""The engines floor sits under both tiers: what the gateway and the control plane both know of
an engine. Its modules import only the shared root and each other, and the control plane
imports the engines, never the gateway, so neither tier reaches the other through it. Every
import counts: those inside functions and under `TYPE_CHECKING` too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuplane

SRC = Path(gpuplane.__file__).parent
SHARED_ROOT = ("averages", "errors", "logs", "resources", "sections")


def imported(package: str) -> dict[str, set[str]]:
    """Each module file of `gpuplane.<package>` -> the gpuplane modules it names in imports."""
    out = {}
    for path in sorted((SRC / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(SRC))] = {n for n in names if n.split(".")[0] == "gpuplane"}
    return out


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_engines_import_only_the_shared_root_and_each_other() -> None:
    allowed = ("gpuplane.engines", *(f"gpuplane.{m}" for m in SHARED_ROOT))
    beyond = {
        module: sorted(n for n in names if not within(n, allowed))
        for module, names in imported("engines").items()
    }
    assert {m: names for m, names in beyond.items() if names} == {}


@pytest.mark.parametrize(("package", "other"), [("control", "serve"), ("serve", "control")])
def test_a_tier_imports_the_engines_never_the_other_tier(package: str, other: str) -> None:
    crossing = {
        module: sorted(n for n in names if within(n, (f"gpuplane.{other}",)))
        for module, names in imported(package).items()
    }
    assert {m: names for m, names in crossing.items() if names} == {}
