"""`gpuplane config`: print every setting with its default, and check a file."""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console

from gpuplane.config import Settings, load_settings
from gpuplane.errors import ConfigError

app = typer.Typer(help="Inspect and validate gpuplane.yaml.", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)


@app.command()
def defaults() -> None:
    """Print the complete configuration with every default. As YAML: a starting gpuplane.yaml."""
    typer.echo(yaml.safe_dump(Settings().model_dump(mode="json"), sort_keys=False), nl=False)


@app.command()
def reference() -> None:
    """Print every setting's type, default and meaning. As Markdown."""
    typer.echo("\n".join(reference_table()))


def reference_table() -> list[str]:
    """Every setting as a Markdown table, one row a key: what `config reference` prints and the
    docs site's configuration page holds (both from the settings models, so neither goes stale)."""
    return ["| key | type | default | meaning |", "|---|---|---|---|", *_rows(Settings, "")]


@app.command()
def check(path: Path = typer.Argument(..., help="gpuplane.yaml to validate")) -> None:
    """Validate a config file. Exit 1 with the reasons when it is invalid."""
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        err.print(f"[red]invalid:[/red] {exc}")
        raise typer.Exit(1) from None
    err.print(
        f"{path} is valid: {len(settings.models)} model(s), {len(settings.tenants)} tenant(s)"
    )


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            rows += _rows(inner, key + ".")
            continue
        item = (getattr(inner, "__args__", None) or (None,))[0]
        if isinstance(item, type) and issubclass(item, BaseModel):
            if get_origin(inner) is list:
                rows.append(_row(f"`{key}`", "list", "`[]`", field.description))
                rows += _rows(item, key + "[].")
            else:  # an optional section (`X | None`): its keys apply once it is set
                rows.append(_row(f"`{key}`", "section or None", "", field.description))
                rows += _rows(item, key + ".")
            continue
        if field.is_required():
            shown = "required"
        else:
            default: Any = field.get_default(call_default_factory=True)
            shown = "" if default is None else f"`{default!r}`"
        rows.append(_row(f"`{key}`", _type_name(inner), shown, field.description))
    return rows


def _type_name(annotation: Any) -> str:
    """`int | None` reads "int or None": a bare `|` would end the table cell; the constraints
    of an `Annotated` type are the field's range, said in its meaning, not in its type."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (dict, list, tuple, set) and args:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    text = str(annotation).replace("<class '", "").replace("'>", "")
    for module in ("typing.", "pydantic.types.", "pydantic.networks."):
        text = text.replace(module, "")
    return "None" if text == "NoneType" else text


def _row(*cells: str | None) -> str:
    """One Markdown table row; a `|` inside a cell is escaped so the row keeps its columns."""
    return "| " + " | ".join((c or "").replace("|", "\\|") for c in cells) + " |"
