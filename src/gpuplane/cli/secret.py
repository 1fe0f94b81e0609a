"""`gpuplane secret set | list | delete`: a team's secrets, which job specs refer to by name
(`env: {TOKEN: {secretRef: NAME}}`); values are stored encrypted and never printed."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    complete_teams,
    console,
    fail,
    print_table,
    relative,
    show,
)

app = typer.Typer(help="A team's secrets for job specs (secretRef).", no_args_is_help=True)
TEAM = typer.Option(..., "--team", help="the team that owns it", autocompletion=complete_teams)


@app.command("set")
def set_(
    name: str = typer.Argument(..., help="the name specs refer to"),
    team: str = TEAM,
    from_file: Path | None = typer.Option(
        None, "--from-file", help="read the value from this file ('-': stdin); default: prompt"
    ),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
) -> None:
    """Store (or replace) a secret. The value is read from a file, stdin or a hidden prompt,
    never from the command line, where other users of the machine could see it."""
    if from_file is None:
        value = typer.prompt("value", hide_input=True)
    elif str(from_file) == "-":
        value = sys.stdin.read()
    else:
        try:
            value = from_file.read_text()
        except OSError as exc:
            fail(f"cannot read {from_file}: {exc.strerror}")
    with client(server, token) as c:
        c.set_secret(team, name, value.removesuffix("\n"))
    console.print(f"secret {name} of team {team} set", highlight=False)


@app.command("list")
def list_(
    team: str = TEAM,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List a team's secrets: names and when they were set, never values."""

    def table(data: list[dict[str, Any]]) -> None:
        now = time.time()
        print_table(
            ["NAME", "TEAM", "SET"],
            [[s["name"], s["team"], relative(s["updated_at"], now)] for s in data],
        )

    show(server, token, output, lambda c: c.secrets(team), table)


@app.command()
def delete(
    name: str = typer.Argument(..., help="the secret's name"),
    team: str = TEAM,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
) -> None:
    """Delete a secret. A job referring to it that has not started yet fails when it would."""
    with client(server, token) as c:
        c.delete_secret(team, name)
    console.print(f"secret {name} of team {team} deleted", highlight=False)
