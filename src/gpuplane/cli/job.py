"""`gpuplane job submit | list | describe | cancel | logs`: jobs on the control plane."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
import yaml

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    Output,
    client,
    console,
    emit,
    fail,
    mib,
    print_reasons,
    print_table,
)
from gpuplane.control.spec import format_duration

app = typer.Typer(help="Submit and follow jobs.", no_args_is_help=True)

FINAL = ("succeeded", "failed", "cancelled")


def _slice(resources: dict[str, Any]) -> str:
    if resources.get("gpus"):
        return f"{resources['gpus']} GPU"
    parts = []
    if resources.get("gpu_mem_mib"):
        parts.append(mib(resources["gpu_mem_mib"]))
    if resources.get("gpu_cores_pct"):
        parts.append(f"{resources['gpu_cores_pct']}%")
    return "/".join(parts) or "-"


def _limit(seconds: float | None) -> str:
    return "-" if seconds is None else f"{format_duration(seconds)} (on a card of speed 1.0)"


def _reason(r: dict[str, Any]) -> str:
    """The closest cluster's reason, as `job describe` heads its list."""
    return f"{r['code']} on {r['cluster']}: {r['message']}"


def _where(job: dict[str, Any]) -> str:
    if not job.get("cluster"):
        return "-"
    devices = ",".join(str(d) for d in job.get("devices", []))
    return f"{job['cluster']}/{job.get('node') or '?'}" + (f" [{devices}]" if devices else "")


@app.command()
def submit(
    file: Path = typer.Argument(..., help="job spec (YAML)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say where it would go; change nothing"),
    server: str | None = SERVER_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Submit a job spec; an impossible request is refused with the reason."""
    try:
        spec = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        fail(f"{file} does not exist")
    except yaml.YAMLError as exc:
        fail(f"{file} is not valid YAML: {exc}")
    with client(server) as c:
        out = c.submit(spec, dry_run=dry_run)

    def table(data: dict[str, Any]) -> None:
        if dry_run:
            if data["fits"]:
                console.print(
                    f"would run on {data['cluster']}/{data['node']} "
                    f"devices {data['devices']} ({data['flavor']})",
                    highlight=False,
                )
                if data["preempts"]:
                    console.print(f"would preempt: {', '.join(data['preempts'])}")
            else:
                console.print("would wait; per cluster:")
                print_reasons(data["reasons"])
            console.print(f"pending jobs of equal or higher priority: {data['queued_ahead']}")
            return
        console.print(
            f"job {data['id']} submitted: {data['state']} {_where(data)}", highlight=False
        )
        if data["state"] == "pending":
            print_reasons(data["reasons"])

    emit(out, output, table)


@app.command("list")
def list_(
    team: str | None = typer.Option(None, "--team"),
    state: str | None = typer.Option(None, "--state"),
    server: str | None = SERVER_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List jobs, newest first."""
    with client(server) as c:
        jobs = c.jobs(team, state)

    def table(data: list[dict[str, Any]]) -> None:
        print_table(
            ["ID", "TEAM", "STATE", "PRIO", "GPU", "WHERE", "REASON"],
            [
                [
                    j["id"],
                    j["team"],
                    j["state"],
                    j["priority"],
                    _slice(j["resources"]),
                    _where(j),
                    (j["reason"]["code"] if j.get("reason") else j.get("message") or ""),
                ]
                for j in data
            ],
        )

    emit(jobs, output, table)


@app.command()
def describe(
    ref: str = typer.Argument(..., help="job id (or name: the newest job of that name)"),
    server: str | None = SERVER_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show a job: spec, state, where it runs, and why it waits."""
    with client(server) as c:
        job = c.job(ref)

    def table(j: dict[str, Any]) -> None:
        rows = [
            ("id", j["id"]),
            ("name", j["name"]),
            ("team", j["team"]),
            ("state", j["state"]),
            ("priority", j["priority"]),
            ("command", " ".join(j["command"])),
            ("resources", _slice(j["resources"])),
            ("where", _where(j)),
            ("gpu model", j.get("flavor") or "-"),
            ("time limit", _limit(j.get("time_limit_s"))),
            ("attempts", j["attempts"]),
            ("queue position", j.get("queue_position") or "-"),
            ("exit code", j.get("exit_code")),
            ("message", j.get("message") or ""),
        ]
        for key, value in rows:
            console.print(
                f"[bold]{key:>14}[/bold]  {'' if value is None else value}", highlight=False
            )
        if j.get("reason"):
            console.print("[bold]       waiting[/bold]  " + _reason(j["reason"]), highlight=False)
            console.print("[bold]   per cluster[/bold]")
            print_reasons(j["reasons"])

    emit(job, output, table)


@app.command()
def cancel(ref: str = typer.Argument(...), server: str | None = SERVER_OPTION) -> None:
    """Cancel a job; a running job's process is stopped."""
    with client(server) as c:
        job = c.cancel(ref)
    typer.echo(f"job {job['id']} {job['state']}")


@app.command()
def logs(
    ref: str = typer.Argument(...),
    tail: int | None = typer.Option(None, "--tail", help="only the last N lines"),
    follow: bool = typer.Option(False, "--follow", "-f", help="wait until the job ends"),
    server: str | None = SERVER_OPTION,
) -> None:
    """Print a job's output (streamed: a large log is never held whole)."""
    with client(server) as c:
        if not follow:
            for chunk in c.logs(ref, tail):
                typer.echo(chunk, nl=False)
            return
        shown = 0  # bytes printed so far; each poll prints only what lies past them
        while True:
            state = c.job(ref)["state"]
            seen = 0
            for chunk in c.logs(ref):
                new = chunk[max(0, shown - seen) :]
                seen += len(chunk)
                if new:
                    typer.echo(new, nl=False)
            shown = max(shown, seen)
            if state in FINAL:
                return
            time.sleep(0.5)
