"""What the control-plane CLI groups share: --server, --token, -o table|wide|json|yaml, times
(ISO-8601 in JSON and YAML, relative in tables), error exits, and shell completion of names."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.table import Table

from gpuplane.cli._secrets import secret_option
from gpuplane.control.client import (
    DEFAULT_SERVER,
    SERVER_ENV,
    TOKEN_ENV,
    ClientError,
    ControlClient,
    field_errors,
)
from gpuplane.control.spec import format_duration
from gpuplane.errors import GpuplaneError


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


SERVER_OPTION = typer.Option(
    None, "--server", envvar=SERVER_ENV, help=f"control plane URL (default {DEFAULT_SERVER})"
)
TOKEN_OPTION = secret_option(
    "--token",
    TOKEN_ENV,
    "API token (default: the admin token a server on this machine wrote to .gpuplane/)",
)
OUTPUT_OPTION = typer.Option(Output.table, "--output", "-o", help="table, wide, json or yaml")

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
PIPED_WIDTH = 200  # piped without $COLUMNS: whole rows for grep and awk


@contextmanager
def client(
    server: str | None, token: str | None = None, *, options: bool = False
) -> Iterator[ControlClient]:
    """A client; any gpuplane error inside exits non-zero with its message. With `options`, the
    fields the API names in a validation error are the command's options (`gpus` is `--gpus`)."""
    try:
        with ControlClient(server, token=token) as c:
            yield c
    except ClientError as exc:
        where = f" (HTTP {exc.status})" if exc.status else ""
        errors = field_errors(exc.body) if options else []
        message = "; ".join(f"{_option(f)}: {msg}" for f, msg in errors) or str(exc)
        err_console.print(f"[red]error{where}:[/red] {message}", highlight=False)
        body = exc.body if isinstance(exc.body, dict) else {}
        for reason in body.get("reasons", []):
            err_console.print(
                f"  {reason['cluster']}: {reason['code']}: {reason['message']}", highlight=False
            )
        raise typer.Exit(1) from None
    except GpuplaneError as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None


def load_spec(file: Path, kind: str, fields: str, example: str) -> dict[str, Any]:
    """A `kind` spec file (YAML) as a mapping; exits with what is wrong otherwise. `fields`
    and `example` say what such a spec holds, for the message."""
    try:
        spec = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        fail(f"{file} does not exist")
    except yaml.YAMLError as exc:
        fail(f"{file} is not valid YAML: {exc}")
    if not isinstance(spec, dict):
        fail(
            f"{file} holds a YAML {type(spec).__name__}; a {kind} spec is a mapping of its fields "
            f"({fields}): see {example}"
        )
    return spec


def fail(message: str) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


def _option(field: str) -> str:
    """The CLI option of an API field: `borrowing_limit_gpus` is `--borrowing-limit-gpus`."""
    return "--" + field.replace("_", "-")


def emit(data: Any, output: Output, table: Callable[[Any], None]) -> None:
    """Print `data` as JSON, YAML, or with the command's own table renderer (which reads
    `-o wide` itself); times (`*_at`) as ISO-8601 in JSON and YAML."""
    if output == Output.json:
        typer.echo(json.dumps(iso_times(data), indent=2))
    elif output == Output.yaml:
        typer.echo(yaml.safe_dump(iso_times(data), sort_keys=False).rstrip())
    else:
        table(data)


def show(
    server: str | None,
    token: str | None,
    output: Output,
    fetch: Callable[[ControlClient], Any],
    table: Callable[[Any], None],
) -> None:
    """The body every list, describe and change command shares: `fetch` one view from the
    control plane (its errors exit non-zero, `client`), then print it (`emit`)."""
    with client(server, token) as c:
        data = fetch(c)
    emit(data, output, table)


def print_fields(rows: Iterable[tuple[str, Any]], width: int) -> None:
    """A describe view's fields, one per line: the name bold and right-aligned in `width`
    columns, the value after it (None as blank)."""
    for key, value in rows:
        value = "" if value is None else value
        console.print(f"[bold]{key:>{width}}[/bold]  {value}", highlight=False)


def iso(ts: float) -> str:
    """A Unix time as ISO-8601 in UTC: `2026-12-01T20:27:45Z`."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def iso_times(data: Any) -> Any:
    """`data` with every time field (`at`, or a key ending in `_at`, as the API's views name
    them) as ISO-8601."""
    if isinstance(data, list):
        return [iso_times(d) for d in data]
    if isinstance(data, dict):
        return {
            k: iso(v)
            if (k == "at" or k.endswith("_at"))
            and isinstance(v, int | float)
            and not isinstance(v, bool)
            else iso_times(v)
            for k, v in data.items()
        }
    return data


def relative(ts: float | None, now: float) -> str:
    """A time as tables show it, against `now`: `3m ago`, `in 2h`, `now`; `-` for none."""
    if ts is None:
        return "-"
    delta = now - ts
    if abs(delta) < 1:
        return "now"
    match = re.match(r"\d+\D+", format_duration(abs(delta)))  # the largest unit only
    span = match.group() if match else f"{abs(delta):.0f}s"
    return f"{span} ago" if delta > 0 else f"in {span}"


def table_width() -> int:
    """The width tables fit: the terminal's, else $COLUMNS, else PIPED_WIDTH."""
    if console.is_terminal:
        return console.size.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


def fitting_columns(
    columns: Sequence[str], rows: Sequence[Sequence[str]], width: int, drop: Sequence[str]
) -> list[int]:
    """Pure: the indices of the columns to show in `width`: all when their whole cells fit,
    else without the `drop` columns, least important first, until they do. The last column
    (a reason, a message) folds, so it needs only FOLDED_WIDTH of its longest cell."""
    shown = list(range(len(columns)))
    for name in [None, *drop]:
        if name in columns:
            shown.remove(columns.index(name))
        needed = [max(len(c) for c in [columns[i], *(row[i] for row in rows)]) for i in shown]
        needed[-1] = min(needed[-1], max(FOLDED_WIDTH, len(columns[shown[-1]])))
        if sum(needed) + _GAP * (len(shown) - 1) <= width:
            break
    return shown


_GAP = 2  # Rich's padding between the columns of a box-less table
FOLDED_WIDTH = 24  # the least a folding last column keeps: a few words a line


def print_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    title: str | None = None,
    *,
    drop: Sequence[str] = (),
) -> None:
    """A box-less table that fits the terminal: `drop` names the columns to leave out, least
    important first, while the rest do not fit whole (`-o wide` and `-o json` keep them);
    cells never wrap but the last column, which folds, and a cell still too long ends in `…`."""
    width = table_width()
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    shown = fitting_columns(columns, cells, width, drop)
    t = Table(title=title, box=None, header_style="bold", pad_edge=False, width=None)
    for i in shown:
        last = i == shown[-1]
        t.add_column(columns[i], no_wrap=not last, overflow="fold" if last else "ellipsis")
    for row in cells:
        t.add_row(*(row[i] for i in shown))
    if not console.is_terminal:  # Rich caps a print's width at its console's
        console.width = width
    console.print(t)


def print_reasons(reasons: Sequence[dict[str, Any]]) -> None:
    """One line per cluster; the message says the numbers in the CLI's units (`-o json` has
    them raw, in milli-GPUs and MiB)."""
    for r in reasons:
        console.print(f"  {r['cluster']}: {r['code']}: {r['message']}", highlight=False)


def mib(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f}GiB" if value >= 1024 else f"{value}MiB"


COMPLETION_TIMEOUT_S = 1.0


def _completer(
    names: Callable[[ControlClient], Iterable[str]],
) -> Callable[[typer.Context, str], list[str]]:
    """A shell completion of names the API lists (against the command's --server), under a short
    timeout; silent, offering nothing, when the control plane does not answer."""

    def complete(ctx: typer.Context, incomplete: str) -> list[str]:
        try:
            server, token = ctx.params.get("server"), ctx.params.get("token")
            with ControlClient(server, token=token, timeout_s=COMPLETION_TIMEOUT_S) as c:
                return sorted({n for n in names(c) if n.startswith(incomplete)})
        except (GpuplaneError, ValueError):  # unreachable, refused, or not the API's JSON
            return []

    return complete


complete_jobs = _completer(lambda c: [r for j in c.jobs() for r in (j["id"], j["name"])])
complete_clusters = _completer(lambda c: [x["name"] for x in c.clusters()])
complete_teams = _completer(lambda c: [t["name"] for t in c.teams()])
