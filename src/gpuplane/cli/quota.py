"""`gpuplane quota set | show`: team quotas per GPU model (Kueue-style), cohorts and usage."""

from __future__ import annotations

from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    Output,
    client,
    emit,
    mib,
    print_table,
)

app = typer.Typer(help="Team quotas.", no_args_is_help=True)


@app.command("set")
def set_(
    team: str = typer.Argument(...),
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
    output: Output = OUTPUT_OPTION,
) -> None:
    """Set a team's nominal quota on a GPU model, and/or its cohort and weight."""
    if flavor is None and cohort is None and weight is None:
        typer.echo("error: give --gpu-model with --gpus, and/or --cohort / --weight", err=True)
        raise typer.Exit(2)
    if flavor is not None and gpus is None:
        typer.echo("error: --gpu-model needs --gpus (the nominal quota)", err=True)
        raise typer.Exit(2)
    with client(server) as c:
        out: dict[str, Any] = {}
        if cohort is not None or weight is not None:
            current = {}
            try:
                current = c.team(team)
            except Exception:
                current = {}
            out = c.set_team(
                team,
                {
                    "cohort": cohort if cohort is not None else current.get("cohort"),
                    "weight": weight if weight is not None else current.get("weight", 1.0),
                },
            )
        if flavor is not None:
            out = c.set_quota(
                team,
                flavor,
                {
                    "gpus": gpus,
                    "gpu_mem_mib": gpu_mem_mib,
                    "borrowing_limit_gpus": borrow_gpus,
                    "borrowing_limit_mem_mib": borrow_mem,
                    "lending_limit_gpus": lend_gpus,
                    "lending_limit_mem_mib": lend_mem,
                },
            )
    emit(out, output, lambda t: _teams_table([t]))


@app.command()
def show(
    team: str | None = typer.Argument(None),
    server: str | None = SERVER_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show quotas and usage of one team or of all."""
    with client(server) as c:
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
