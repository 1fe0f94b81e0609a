"""`gpuplane usage`: GPU-hours, slice-hours and cost per team from the control plane's
allocations (`GET /usage`, as the token's role allows: a member sees its team), used and idle
apart where the server's audit samples measured it, and a gateway's tenants. Thin: ask, print."""

from __future__ import annotations

from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    complete_teams,
    emit,
    print_table,
)
from gpuplane.cli._secrets import secret_option
from gpuplane.cli.serve import ADMIN_KEY_ENV


def usage(
    team: str | None = typer.Option(
        None,
        "--team",
        help="show this team only (default: all you may see)",
        autocompletion=complete_teams,
    ),
    since: str = typer.Option(
        "7d", "--since", help="start: a duration ago (7d, 12h) or an ISO time (2026-11-30T00:00)"
    ),
    until: str | None = typer.Option(
        None, "--until", help="end: a duration ago or an ISO time (default: now)"
    ),
    step: str = typer.Option(
        "60s",
        "--step",
        help="allocations are counted once per this (a job's start and end round to it)",
    ),
    gateway: str | None = typer.Option(
        None, "--gateway", help="a gateway URL: adds its tenants' requests and tokens"
    ),
    admin_key: str | None = secret_option("--admin-key", ADMIN_KEY_ENV, "the gateway's admin key"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show GPU-hours and cost per team and GPU model. Slice-hours count a slice's share of the
    card; used and idle apart where the control plane's control.samples_dir measured them, cost from
    its audit.prices; reconciled to the cards' physical GPU-hours."""
    params = {"since": since, "until": until, "step": step, "team": team}
    with client(server, token) as c:
        data = c.usage({k: v for k, v in params.items() if v is not None})
    if gateway is not None:
        from gpuplane.cli.serve import admin_get

        tenants = admin_get(gateway, "/admin/usage", admin_key)["tenants"]
        data["gateway"] = {
            "url": gateway,
            "since": "the gateway's start",
            "tenants": [
                {k: t[k] for k in ("tenant", "requests", "prompt_tokens", "completion_tokens")}
                for t in tenants
                if team is None or t["tenant"] == team
            ],
        }
    emit(data, output, print_usage)


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_usage(d: dict[str, Any]) -> None:
    """The usage report as tables (`gpuplane usage`, `gpuplane audit usage`)."""
    print_table(
        ["TEAM", "MODEL", "GPU-HOURS", "SLICE-HOURS", "USED", "IDLE", "COST"],
        [
            [t["team"], t["gpu_model"], _hours(t["gpu_hours"]), _hours(t["slice_hours"]),
             _hours(t["used_gpu_hours"]), _hours(t["idle_gpu_hours"]),
             "-" if t["cost"] is None else f"{t['cost']:.2f}"]
            for t in d["teams"]
        ],
    )  # fmt: skip
    state = "reconciled" if d["reconciled"] else "NOT reconciled: samples missing?"
    typer.echo(
        f"free {d['free_gpu_hours']:.2f} GPU-hours; physical {d['physical_gpu_hours']:.2f} "
        f"GPU-hours ({state}, gap {d['gap']:.2%})"
    )
    if any(t["used_gpu_hours"] is None for t in d["teams"]):
        typer.echo(
            "USED and IDLE '-': no audit samples measured it (the control plane's "
            "control.samples_dir)",
            err=True,
        )
    if d["unpriced"]:
        typer.echo(f"no price for {', '.join(d['unpriced'])}: set audit.prices", err=True)
    if "gateway" in d:
        typer.echo(f"gateway {d['gateway']['url']}, since its start:")
        print_table(
            ["TENANT", "REQUESTS", "PROMPT TOKENS", "COMPLETION TOKENS"],
            [
                [t["tenant"], t["requests"], t["prompt_tokens"], t["completion_tokens"]]
                for t in d["gateway"]["tenants"]
            ],
        )
