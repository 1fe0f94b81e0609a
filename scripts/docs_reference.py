"""The docs site's reference pages, rendered from the code at build time: a MkDocs hook (see
`hooks:` in mkdocs.yml) that appends to each reference page's prose (docs/reference/) what the
code says: every CLI command from the Typer app, every configuration key from the settings
models, every control API route from the app's OpenAPI document, which also becomes
reference/openapi.json. No table is kept by hand, so none goes stale. Nothing here reaches the
network: the API's document comes from an app over a throwaway store.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import typer
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from gpuplane.cli.config import reference_table
from gpuplane.cli.main import app
from gpuplane.control.identity.auth import POLICY, Rule
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig
from gpuplane.plane import control_app

METHODS = ("get", "post", "put", "delete", "patch")


def cli_reference(root: Any, name: str = "gpuplane") -> str:
    """One section per command, depth first in the app's order: its help, usage and a table of
    its arguments and options, as `--help` prints them. `root` is the app's Click command
    (`typer.main.get_command`); Typer 0.20 and later carry their own copy of Click, so commands
    and parameters are read through the attributes both copies have, not isinstance."""
    lines: list[str] = []
    _command(root, typer.Context(root, info_name=name), lines)
    return "\n".join(lines) + "\n"


def _command(command: Any, ctx: typer.Context, lines: list[str]) -> None:
    path = ctx.command_path
    depth = min(max(path.count(" ") + 1, 2), 4)  # the root and its commands at ##
    lines += [f"{'#' * depth} `{path}`", ""]
    if command.help:
        lines += [_plain(command.help), ""]
    lines += ["```text", command.get_usage(ctx).strip(), "```", ""]
    # each parameter as `--help` shows it: names and metavar, help with default and range
    records = [
        r
        for p in command.get_params(ctx)
        if p.name != "help" and (r := p.get_help_record(ctx)) is not None
    ]
    if records:
        lines += ["| argument or option | meaning |", "|---|---|"]
        # a `|` in a code span stays (Python-Markdown does not split a row there); elsewhere
        # it is escaped
        lines += [
            f"| `{' '.join(names.split())}` | {_cell(_plain(help))} |" for names, help in records
        ]
        lines.append("")
    if hasattr(command, "list_commands"):  # a group
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None and not child.hidden:
                _command(child, typer.Context(child, info_name=sub, parent=ctx), lines)


def api_reference(document: dict[str, Any], policy: dict[tuple[str, str], Rule]) -> str:
    """One table per top-level path segment: each route, who may call it (its row of the policy
    table) and what it does (its summary and the first line of its description)."""
    groups: dict[str, list[str]] = {}
    for path, item in document["paths"].items():
        for method in (m for m in METHODS if m in item):
            op = item[method]
            rule = policy[(method.upper(), path)]
            what = op.get("summary", "")
            if op.get("description"):
                what += ": " + op["description"].strip().splitlines()[0]
            row = [f"`{method.upper()}`", f"`{path}`", _who(rule), _inputs(op), what]
            group = path.strip("/").split("/")[0]
            groups.setdefault(group, []).append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines: list[str] = []
    for group, rows in groups.items():
        lines += [f"## `/{group}`", "", "| method | path | who may call | takes | what it does |"]
        lines += ["|---|---|---|---|---|", *rows, ""]
    return "\n".join(lines)


def _inputs(op: dict[str, Any]) -> str:
    """The query parameters by name and the body by its schema's name (path ones are in the
    path); the document has each schema in full."""
    taken = [f"`{p['name']}`" for p in op.get("parameters", []) if p["in"] == "query"]
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = body.get("schema", {}).get("$ref")
    if ref:
        taken.append(f"body: `{ref.rsplit('/', 1)[-1]}`")
    return ", ".join(taken)


def _who(rule: Rule) -> str:
    if rule.role is None:
        return "anyone"
    return f"{rule.role.value}, own team" if rule.team_scoped else rule.role.value


def _plain(text: str) -> str:
    """Click's help text as one paragraph of Markdown (Typer keeps docstrings' line breaks)."""
    return " ".join(text.replace("\b", "").split())


def _cell(text: str) -> str:
    """A table cell: one line, a `|` escaped so the row keeps its columns."""
    return " ".join(text.split()).replace("|", "\\|")


def openapi_document() -> dict[str, Any]:
    """The control API's OpenAPI document, from an app over a service on a throwaway store."""
    with tempfile.TemporaryDirectory() as state_dir:
        service = ControlService(ControlConfig(state_dir=state_dir), bind_on_submit=False)
        try:
            return control_app(service, background=False).openapi()
        finally:
            service.close()


_generated: dict[str, str] = {}  # page -> its tables, rendered once per build (on_files)


def reference_pages(document: dict[str, Any]) -> dict[str, str]:
    """Each reference page (its path under docs/) -> the tables the code gives it."""
    pages = {
        "reference/cli.md": cli_reference(typer.main.get_command(app)),
        "reference/configuration.md": "\n".join(reference_table()) + "\n",
        "reference/control-api.md": api_reference(document, POLICY),
    }
    return {path: _no_html(text) for path, text in pages.items()}


def _no_html(page: str) -> str:
    """Help texts say `<state_dir>/control.db`: outside code, Markdown would take `<state_dir>`
    for an HTML tag and drop it, so a `<` there is written as an entity."""
    lines, fenced = [], False
    for line in page.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith("```"):
            parts = line.split("`")  # even parts are outside code spans
            line = "`".join(
                p.replace("<", "&lt;") if i % 2 == 0 else p for i, p in enumerate(parts)
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Render every table from the code once per build, and add the OpenAPI document."""
    document = openapi_document()
    _generated.clear()
    _generated.update(reference_pages(document))
    files.append(
        File.generated(config, "reference/openapi.json", content=json.dumps(document, indent=2))
    )
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    """A reference page is its prose, then what the code says."""
    return markdown + "\n" + _generated.get(page.file.src_uri, "")
