"""`gpuplane usage`: GPU-hours, slice-hours and cost per team from the control plane's
allocations, idle apart where audit samples measured it, and the gateway's tenants. Thin: read the
store (`audit.collect.store`), run the audit's usage arithmetic (`audit.usage`), print."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import typer

from gpuplane.cli._control_common import OUTPUT_OPTION, Output, emit, fail, print_table
from gpuplane.cli.serve import ADMIN_KEY_ENV
from gpuplane.control.spec import parse_duration
from gpuplane.errors import GpuplaneError

# One row per card per step is built in memory: a year at one a minute fits, a century does not.
MAX_STEPS = 1_000_000


def usage(
    team: str | None = typer.Option(None, "--team", help="show this team only (default: all)"),
    since: str = typer.Option(
        "7d", "--since", help="start: a duration ago (7d, 12h) or an ISO time (2026-11-30T00:00)"
    ),
    until: str | None = typer.Option(
        None, "--until", help="end: a duration ago or an ISO time (default: now)"
    ),
    config: Path | None = typer.Option(
        None, "--config", help="gpuplane.yaml: control.database_url and audit.prices"
    ),
    db: str | None = typer.Option(
        None, "--db", help="the control plane's database URL (default: control.database_url)"
    ),
    samples: Path | None = typer.Option(
        None,
        "--samples",
        help="an audit sample store (`gpuplane audit collect`): adds used and idle GPU-hours",
    ),
    gateway: str | None = typer.Option(
        None, "--gateway", help="a gateway URL: adds its tenants' requests and tokens"
    ),
    admin_key: str | None = typer.Option(
        None,
        "--admin-key",
        envvar=ADMIN_KEY_ENV,
        help=f"the gateway's admin key (${ADMIN_KEY_ENV})",
    ),
    step: str = typer.Option(
        "60s",
        "--step",
        help="allocations are counted once per this (a job's start and end round to it)",
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """GPU-hours and slice-hours per team and GPU model (a slice counts its share of the card),
    used and idle apart where audit samples exist, cost from audit.prices; reconciled to the
    cards' physical GPU-hours."""
    from gpuplane.audit.collect import CollectError
    from gpuplane.audit.collect.store import collect, window_of
    from gpuplane.audit.samples import SampleStore
    from gpuplane.audit.usage import measured
    from gpuplane.audit.usage import usage as team_usage
    from gpuplane.config import load_settings

    now = datetime.now(UTC)
    # nothing is known past now: a running job is counted up to now, not to a later --until
    lo, hi = _when(since, now, "--since"), min(_when(until, now, "--until"), now) if until else now
    if lo >= hi:
        fail(f"--since {since} is not before --until {until or 'now'}: give an earlier --since")
    step_s = _seconds(step, "--step")
    if (steps := (hi - lo).total_seconds() / step_s) > MAX_STEPS:
        fail(
            f"--since {since} with --step {step} is {steps:,.0f} steps a card (at most "
            f"{MAX_STEPS:,}): give a shorter window or a longer --step"
        )
    try:
        settings = load_settings(config)
        url = db or settings.control.resolved_database_url()
        allocations = collect(url, lo, hi, step_s)
        if samples is not None:
            if not samples.is_dir():
                fail(
                    f"--samples {samples} is not a directory; collect with `gpuplane audit collect`"
                )
            allocations = measured(allocations, SampleStore(samples), step_s)
        u = team_usage(
            allocations, window_of(lo.timestamp(), hi.timestamp(), step_s), settings.audit
        )
    except (GpuplaneError, CollectError, ValueError) as exc:
        fail(str(exc))
        raise  # unreachable: fail exits
    data = u.to_json() | {
        "since": lo.isoformat(timespec="seconds"),
        "until": hi.isoformat(timespec="seconds"),
    }
    if team is not None:
        data["teams"] = [t for t in data["teams"] if t["team"] == team]
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


def _when(value: str, now: datetime, option: str) -> datetime:
    """A duration before `now`, or an ISO time (UTC unless it says otherwise)."""
    try:
        return now - timedelta(seconds=parse_duration(value))
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        fail(f"{option} {value!r} is neither a duration (7d, 12h, 90m) nor an ISO time")
        raise  # unreachable: fail exits
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _seconds(value: str, option: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        fail(f"{option}: {exc}")
        raise  # unreachable: fail exits


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
        typer.echo("USED and IDLE '-': no audit samples measured it (give --samples)", err=True)
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
