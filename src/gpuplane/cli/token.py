"""`gpuplane token create | list | revoke`: API tokens (admins only); a token is shown once."""

from __future__ import annotations

import time
from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    console,
    emit,
    fail,
    print_table,
    relative,
    show,
)
from gpuplane.control.identity.auth import Role
from gpuplane.control.spec import parse_duration

app = typer.Typer(help="API tokens: who may call the control plane.", no_args_is_help=True)


@app.command()
def create(
    role: Role = typer.Option(..., "--role", help="viewer, member or admin"),
    team: str | None = typer.Option(None, "--team", help="the team it acts for (not for admin)"),
    name: str = typer.Option("", "--name", help="what it is for, shown by `token list`"),
    expires: str | None = typer.Option(None, "--expires", help="e.g. 30d, 12h; default never"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Make a token and print it, this once. It is stored only as a keyed hash."""
    ttl = None
    if expires is not None:
        try:
            ttl = parse_duration(expires)
        except ValueError as exc:
            fail(f"--expires: {exc}")
    body = {"role": role.value, "team": team, "name": name, "expires_in_s": ttl}
    with client(server, token, options=True) as c:
        made = c.create_token(body)

    def table(data: dict[str, Any]) -> None:
        who = f"team {data['team']}" if data["team"] else "every team"
        console.print(f"token {data['id']} ({data['role']}, {who}); shown once, keep it:")
        console.print(data["token"], highlight=False, soft_wrap=True)

    emit(made, output, table)


@app.command("list")
def list_(
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List tokens (never their secrets)."""

    def table(data: list[dict[str, Any]]) -> None:
        now = time.time()
        print_table(
            ["ID", "NAME", "TEAM", "ROLE", "CREATED", "EXPIRES", "REVOKED"],
            [
                [
                    t["id"],
                    t["name"],
                    t["team"] or "*",
                    t["role"],
                    relative(t["created_at"], now),
                    relative(t["expires_at"], now),
                    relative(t["revoked_at"], now),
                ]
                for t in data
            ],
        )

    show(server, token, output, lambda c: c.tokens(), table)


@app.command()
def revoke(
    token_id: str = typer.Argument(..., help="the ID `token list` shows"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
) -> None:
    """Revoke a token: it stops working at once. Revoking it again changes nothing."""
    with client(server, token) as c:
        c.revoke_token(token_id)
    console.print(f"token {token_id} revoked", highlight=False)
