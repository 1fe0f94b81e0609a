"""`gpuplane quota set | show`: team quotas per GPU model (Kueue-style), cohorts and usage."""

from __future__ import annotations

from typing import Any, NoReturn

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    client,
    complete_teams,
    emit,
    mib,
    print_table,
)
from gpuplane.control.client import ClientError, ControlClient

app = typer.Typer(help="Team quotas.", no_args_is_help=True)


QUOTA_FIELDS = (
    "gpus",
    "gpu_mem_mib",
    "borrowing_limit_gpus",
    "borrowing_limit_mem_mib",
    "lending_limit_gpus",
    "lending_limit_mem_mib",
)


@app.command("set")
def set_(
    team: str = typer.Argument(..., autocompletion=complete_teams),
    flavor: str | None = typer.Option(
        None, "--gpu-model", "--flavor", help="GPU model (ResourceFlavor) the quota is for"
    ),
    gpus: float | None = typer.Option(None, "--gpus", help="nominal GPUs (fractions allowed)"),
    gpu_mem_mib: int | None = typer.Option(None, "--gpu-mem-mib", help="nominal GPU memory"),
    borrow_gpus: float | None = typer.Option(None, "--borrowing-limit-gpus"),
    borrow_mem: int | None = typer.Option(None, "--borrowing-limit-mem-mib"),
    lend_gpus: float | None = typer.Option(
        None, "--lending-limit-gpus", help="most of this quota the cohort may borrow"
    ),
    lend_mem: int | None = typer.Option(None, "--lending-limit-mem-mib"),
    cohort: str | None = typer.Option(None, "--cohort", help="share unused quota with this cohort"),
    weight: float | None = typer.Option(None, "--weight", help="fair-share weight"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Change a team's quota, cohort or weight. On a GPU model; what is not given keeps its value
    (--gpu-model may be left out when the team has one quota)."""
    values = (gpus, gpu_mem_mib, borrow_gpus, borrow_mem, lend_gpus, lend_mem)
    quota = {k: v for k, v in zip(QUOTA_FIELDS, values, strict=True) if v is not None}
    team_fields = {k: v for k, v in (("cohort", cohort), ("weight", weight)) if v is not None}
    if not quota and not team_fields:
        _usage(
            "give what to change: --gpus, --gpu-mem-mib, a --borrowing-limit-* or "
            "--lending-limit-* option, --cohort or --weight"
        )
    with client(server, token, options=True) as c:
        current = _team_or_none(c, team)
        out = current or {}
        if team_fields:
            out = c.set_team(
                team,
                {
                    "cohort": out.get("cohort"),
                    "weight": out.get("weight", 1.0),
                    **team_fields,
                },
            )
        if quota:
            flavor, existing = _quota_of(team, current, flavor)
            body = {k: existing.get(k) for k in QUOTA_FIELDS} | quota
            if body["gpus"] is None:
                _usage(f"team {team} has no quota on {flavor} yet: give its nominal --gpus")
            out = c.set_quota(team, flavor, body)
    emit(out, output, lambda t: _teams_table([t]))


def _usage(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _team_or_none(c: ControlClient, team: str) -> dict[str, Any] | None:
    try:
        return c.team(team)
    except ClientError as exc:
        if exc.status == 404:
            return None
        raise


def _quota_of(
    team: str, current: dict[str, Any] | None, flavor: str | None
) -> tuple[str, dict[str, Any]]:
    """The GPU model a quota edit is for and that quota's values now (none if it has none)."""
    quotas = {q["flavor"]: q for q in (current or {}).get("quotas", [])}
    if flavor is None:
        if len(quotas) != 1:
            have = ", ".join(sorted(quotas)) or "none yet"
            _usage(f"say which quota of team {team} to change with --gpu-model (it has: {have})")
        (flavor,) = quotas
    return flavor, quotas.get(flavor, {})


@app.command()
def show(
    team: str | None = typer.Argument(None, autocompletion=complete_teams),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show quotas and usage of one team or of all."""
    with client(server, token) as c:
        data: Any = c.team(team) if team else c.teams()
    emit(data, output, lambda d: _teams_table([d] if isinstance(d, dict) else d))


def _limit(value: Any) -> str:
    return "-" if value is None else str(value)


def _teams_table(teams: list[dict[str, Any]]) -> None:
    rows = []
    for t in teams:
        head = [t["name"], t["cohort"] or "-", t["weight"], f"{t['dominant_share']:.3f}"]
        if not t["quotas"]:
            rows.append(
                [
                    *head,
                    "(any)",
                    "unlimited",
                    "-",
                    "-",
                    "-",
                    f"{t['used_gpus']:g}",
                    mib(t["used_gpu_mem_mib"]),
                ]
            )
        for q in t["quotas"]:
            rows.append(
                [
                    *head,
                    q["flavor"],
                    f"{q['gpus']:g}",
                    mib(q["gpu_mem_mib"]),
                    _limit(q["borrowing_limit_gpus"]),
                    _limit(q.get("lending_limit_gpus")),
                    f"{q['used_gpus']:g}",
                    mib(q["used_gpu_mem_mib"]),
                ]
            )
    print_table(
        [
            "TEAM",
            "COHORT",
            "WEIGHT",
            "SHARE",
            "GPU MODEL",
            "GPUS",
            "GPU MEM",
            "BORROW LIMIT",
            "LEND LIMIT",
            "USED GPUS",
            "USED MEM",
        ],
        rows,
    )
