"""The docs site's reference pages (scripts/docs_reference.py, a MkDocs hook) cover the whole
code: every CLI command, every configuration key and every route of the control API. The strict
build checks links and the nav, not that a table is complete: a walk that stopped at the root
(Typer carrying its own copy of Click) would still build."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer

from gpuplane.cli.config import reference_table
from gpuplane.cli.main import app

ROOT = Path(__file__).parents[1]
HOOK = ROOT / "scripts" / "docs_reference.py"


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", HOOK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paths(command: Any, ctx: typer.Context) -> list[str]:
    """Every command's path, as `--help` would name it."""
    found = [ctx.command_path]
    for name in getattr(command, "list_commands", lambda _: [])(ctx):
        child = command.get_command(ctx, name)
        found += _paths(child, typer.Context(child, info_name=name, parent=ctx))
    return found


def test_every_cli_command_has_a_section(hook: ModuleType) -> None:
    root = typer.main.get_command(app)
    page = hook.cli_reference(root)
    headings = set(re.findall(r"^#+ `([^`]+)`$", page, re.M))
    paths = _paths(root, typer.Context(root, info_name="gpuplane"))
    assert len(paths) > 50
    assert [p for p in paths if p not in headings] == []
    assert "| `--dry-run` | say where it would go; change nothing |" in page


def test_every_api_route_has_a_row(hook: ModuleType) -> None:
    document = hook.openapi_document()
    page = hook.api_reference(document, hook.POLICY)
    routes = [(m.upper(), p) for p, item in document["paths"].items() for m in item]
    assert len(routes) > 30
    missing = [r for r in routes if f"| `{r[0]}` | `{r[1]}` |" not in page]
    assert missing == []
    assert "| `POST` | `/jobs` | member, own team |" in page


def test_each_page_is_prose_then_the_code_s_tables(hook: ModuleType) -> None:
    pages = hook.reference_pages(hook.openapi_document())
    table = "\n".join(reference_table()) + "\n"
    assert pages["reference/configuration.md"] == table.replace("<state_dir>", "&lt;state_dir>")
    for path in pages:  # each has its prose page, in the nav
        assert (ROOT / "docs" / path).is_file(), path
        assert path in (ROOT / "mkdocs.yml").read_text(), path
