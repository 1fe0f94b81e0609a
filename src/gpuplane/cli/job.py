"""`gpuplane job submit | list | describe | cancel | logs`: jobs on the control plane."""

from __future__ import annotations

import json
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
    complete_jobs,
    complete_teams,
    console,
    emit,
    err_console,
    fail,
    iso_times,
    load_spec,
    mib,
    print_fields,
    print_reasons,
    print_table,
    relative,
    show,
)
from gpuplane.cli.events import timeline_rows
from gpuplane.control.client import ControlClient
from gpuplane.control.spec import format_duration

app = typer.Typer(help="Submit and follow jobs.", no_args_is_help=True)

FINAL = ("succeeded", "failed", "cancelled")
JOB_REF = typer.Argument(
    ..., help="job id (or name: the newest job of that name)", autocompletion=complete_jobs
)
POLL_S = 0.5
_pause = time.sleep  # between polls of --wait, --watch and --follow


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
    wait: bool = typer.Option(False, "--wait", help="wait until it ends; exit with its code"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Submit a job spec. An impossible request is refused with the reason."""
    if wait and dry_run:
        fail("--wait and --dry-run exclude each other: a dry run submits nothing to wait for")
    spec = load_spec(
        file, "job", "name, team, command, resources, ...", "examples/control/hello.yaml"
    )
    with client(server, token) as c:
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
    if wait:
        _wait(server, token, out["id"], logs_to_stderr=output in (Output.json, Output.yaml))


def _wait(server: str | None, token: str | None, job_id: str, *, logs_to_stderr: bool) -> None:
    """Stream the job's output as it comes (as `ray job submit` and `sky launch` do; on stderr
    when stdout carries `-o json|yaml`) until it ends, then say its final state and exit with
    its exit code (1 for a job that failed without one)."""
    with client(server, token) as c:
        job = _follow(c, job_id, err=logs_to_stderr)
    code, ok = job.get("exit_code"), job["state"] == "succeeded"
    shown = "" if code is None else f" (exit code {code})"
    why = f": {job['message']}" if job.get("message") and not ok else ""
    err_console.print(f"job {job_id} {job['state']}{shown}{why}", highlight=False)
    if code is not None and code < 0:  # killed by a signal: as a shell reports it
        code = 128 - code
    raise typer.Exit(code or int(not ok))


def _follow(c: ControlClient, ref: str, *, err: bool = False) -> dict[str, Any]:
    """Print the job's output as it grows until the job ends (each poll asks only for the bytes
    past those printed: a large log is never held whole); returns the ended job."""
    shown = 0
    while True:
        job = c.job(ref)
        for chunk in c.logs(ref, since=shown):
            shown += len(chunk)
            typer.echo(chunk, nl=False, err=err)
        if job["state"] in FINAL:
            return job
        _pause(POLL_S)


@app.command("list")
def list_(
    team: str | None = typer.Option(None, "--team", autocompletion=complete_teams),
    state: str | None = typer.Option(None, "--state", help="pending, running, failed, ..."),
    watch: bool = typer.Option(False, "--watch", "-w", help="re-render on change until Ctrl-C"),
    interval: float = typer.Option(
        2.0, "--interval", min=0.5, max=60, help="seconds between polls of --watch"
    ),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """List jobs, newest first."""
    with client(server, token) as c:
        jobs = c.jobs(team, state)
        if not watch:
            emit(jobs, output, lambda data: _jobs_table(data, output == Output.wide))
            return
        seen: dict[str, dict[str, Any]] = {}
        try:
            while True:
                changed = [j for j in jobs if seen.get(j["id"]) != j]
                seen = {j["id"]: j for j in jobs}
                if output == Output.json:  # a line per job that is new or changed
                    for j in reversed(changed):
                        typer.echo(json.dumps(iso_times(j)))
                elif changed:
                    if console.is_terminal:
                        console.clear()
                    emit(jobs, output, lambda data: _jobs_table(data, output == Output.wide))
                _pause(interval)
                jobs = c.jobs(team, state)
        except KeyboardInterrupt:
            return


def _jobs_table(jobs: list[dict[str, Any]], wide: bool) -> None:
    now = time.time()
    columns = ["ID", "TEAM", "STATE", "PRIO", "GPU", "WHERE", "AGE"]
    if wide:
        columns += ["CLUSTER", "NODE", "DEVICES", "STARTED", "FINISHED", "EXIT"]
    rows = []
    for j in jobs:
        row = [
            j["id"],
            j["team"],
            j["state"],
            j["priority"],
            _slice(j["resources"]),
            _where(j),
            relative(j["created_at"], now),
        ]
        if wide:
            row += [
                j.get("cluster") or "-",
                j.get("node") or "-",
                ",".join(str(d) for d in j.get("devices", [])) or "-",
                relative(j.get("started_at"), now),
                relative(j.get("finished_at"), now),
                "-" if j.get("exit_code") is None else j["exit_code"],
            ]
        rows.append([*row, j["reason"]["code"] if j.get("reason") else j.get("message") or ""])
    print_table([*columns, "REASON"], rows, drop=JOB_DROP)


# what a narrow terminal leaves out of `job list` first (`-o json` has everything)
JOB_DROP = ("FINISHED", "STARTED", "DEVICES", "NODE", "CLUSTER", "EXIT", "PRIO", "AGE", "WHERE")


def _env(env: dict[str, Any]) -> str:
    """Names and values, a reference as `secretRef:NAME` / `fromEnv:NAME` (never its value)."""
    shown = []
    for name, value in env.items():
        if not isinstance(value, str):  # {secretRef: NAME} or {fromEnv: NAME}
            value = "<{}:{}>".format(*next(iter(value.items())))
        shown.append(f"{name}={value}")
    return " ".join(shown) or "-"


@app.command()
def describe(
    ref: str = JOB_REF,
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show a job: spec, state, where it runs, and why it waits."""

    def table(j: dict[str, Any]) -> None:
        now = time.time()
        rows = [
            ("id", j["id"]),
            ("name", j["name"]),
            ("team", j["team"]),
            ("state", j["state"]),
            ("priority", j["priority"]),
            ("command", " ".join(j["command"])),
            ("env", _env(j.get("env") or {})),
            ("resources", _slice(j["resources"])),
            ("where", _where(j)),
            ("gpu model", j.get("flavor") or "-"),
            ("time limit", _limit(j.get("time_limit_s"))),
            ("attempts", j["attempts"]),
            ("created", relative(j["created_at"], now)),
            ("started", relative(j.get("started_at"), now)),
            ("finished", relative(j.get("finished_at"), now)),
            ("queue position", j.get("queue_position") or "-"),
            ("exit code", j.get("exit_code")),
            ("message", j.get("message") or ""),
        ]
        print_fields(rows, 14)
        if j.get("reason"):
            console.print("[bold]       waiting[/bold]  " + _reason(j["reason"]), highlight=False)
            console.print("[bold]   per cluster[/bold]")
            print_reasons(j["reasons"])
        if j.get("timeline"):
            console.print("[bold]      timeline[/bold]")
            for line in timeline_rows(j["timeline"], now):
                console.print(f"  {line}", highlight=False)

    show(server, token, output, lambda c: c.job(ref), table)


@app.command()
def cancel(
    ref: str = JOB_REF, server: str | None = SERVER_OPTION, token: str | None = TOKEN_OPTION
) -> None:
    """Cancel a job; a running job's process is stopped."""
    with client(server, token) as c:
        job = c.cancel(ref)
    typer.echo(f"job {job['id']} {job['state']}")


@app.command()
def logs(
    ref: str = JOB_REF,
    tail: int | None = typer.Option(None, "--tail", help="only the last N lines"),
    follow: bool = typer.Option(False, "--follow", "-f", help="wait until the job ends"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
) -> None:
    """Print a job's output (streamed: a large log is never held whole)."""
    with client(server, token) as c:
        if not follow:
            for chunk in c.logs(ref, tail):
                typer.echo(chunk, nl=False)
            return
        _follow(c, ref)
