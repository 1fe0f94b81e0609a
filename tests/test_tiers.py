"""The tiers hold, by import, counting every import (inside functions and under TYPE_CHECKING
too; `tests/tiers.py` reads them): `serve` and `control` import neither each other nor `audit`,
`batch` or `console`; `engines` imports only the shared root and itself; no module imports another
package's private module; no import circle but the scheduler's policy registry's; no module
over 400 lines and no function over 80 (migrations aside)."""

from __future__ import annotations

import textwrap
from functools import cache
from pathlib import Path

from tests import tiers


@cache
def _violations(root: Path = tiers.SRC) -> dict[str, str]:
    """Every violation under `root`: its key (rule and what) -> where it is and why (read
    once)."""
    known = tiers.modules(root)
    edges = tiers.imports(root)
    out: dict[str, str] = {}
    for rule, found in (
        ("tier", tiers.crossings(edges)),
        ("private", tiers.private_reaches(edges)),
    ):
        for e, why in found:
            key = f"{rule}: {e.source} -> {e.target}"
            out.setdefault(key, f"{e.where(root)}: imports {e.target} ({why})")
    for circle in tiers.circles(tiers.graph(edges, known)):
        links = [
            f"{e.where(root)} {e.source} -> {e.target}"
            for e in edges
            if {e.source, e.target} <= set(circle)
        ]
        out[f"circle: {', '.join(circle)}"] = "import circle: " + "; ".join(links)
    for o in tiers.oversize(root):
        limit = tiers.MAX_FUNCTION_LINES if ":" in o.key else tiers.MAX_MODULE_LINES
        where = f"src/gpuplane/{o.path.relative_to(root)}:{o.line}"
        out[f"size: {o.key}"] = f"{where}: {o.key} is {o.lines} lines (at most {limit})"
    return out


def _fail_on(rule: str) -> None:
    found = {k: v for k, v in _violations().items() if k.startswith(rule)}
    assert not found, "\n".join(found.values())


def test_serve_control_and_engines_import_no_tier_they_must_not_know() -> None:
    _fail_on("tier:")


def test_no_module_imports_another_packages_private_module() -> None:
    _fail_on("private:")


def test_no_import_circle_but_the_policy_registrys() -> None:
    _fail_on("circle:")
    registry, policies = tiers.REGISTRY_LOAD  # the exemption still names a real import
    assert any(e.source == registry and e.target == policies for e in tiers.imports())


def test_no_module_over_400_lines_and_no_function_over_80() -> None:
    _fail_on("size:")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "gpuplane" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "gpuplane"


def test_lazy_type_checking_and_relative_imports_all_count(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "serve/__init__.py": "",
            "serve/app.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from gpuplane.control.store import Store
                def f():
                    import gpuplane.batch.report
                from . import router
                """,
            "serve/router.py": "from gpuplane.control.adapters import _procs\n",
            "control/__init__.py": "",
            "control/store.py": "from gpuplane.control import adapters\n",
            "control/adapters/__init__.py": "from gpuplane.control.adapters import _procs\n",
            "control/adapters/_procs.py": "import gpuplane.control.store\n",
            "batch/__init__.py": "",
            "batch/report.py": "",
        },
    )
    found = _violations(src)
    assert found["tier: gpuplane.serve.app -> gpuplane.control.store"].startswith(
        "src/gpuplane/serve/app.py:3: imports gpuplane.control.store"
    )
    assert "tier: gpuplane.serve.app -> gpuplane.batch.report" in found  # lazy, in a function
    assert "private: gpuplane.serve.router -> gpuplane.control.adapters._procs" in found
    assert "private: gpuplane.control.adapters -> gpuplane.control.adapters._procs" not in found
    circle = "gpuplane.control.adapters, gpuplane.control.adapters._procs, gpuplane.control.store"
    assert f"circle: {circle}" in found
    assert not any("serve.router" in k and "circle" in k for k in found)  # app -> router only
