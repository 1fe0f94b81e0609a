"""`gpuplane events`: the control plane's trail (job steps and the calls that changed things),
and the timeline rows `job describe` prints."""

from __future__ import annotations

import time
from typing import Any

import typer

from gpuplane.cli._control_common import (
    OUTPUT_OPTION,
    SERVER_OPTION,
    TOKEN_OPTION,
    Output,
    complete_teams,
    iso,
    print_table,
    relative,
    show,
)


def events(
    team: str | None = typer.Option(None, "--team", autocompletion=complete_teams),
    since: str | None = typer.Option(None, "--since", help="only the last 1h, 30m, 7d, ..."),
    kind: list[str] = typer.Option(
        [], "--kind", help="only this kind (repeat for several): api, submitted, started, ..."
    ),
    limit: int = typer.Option(500, "--limit", help="the newest N"),
    server: str | None = SERVER_OPTION,
    token: str | None = TOKEN_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show the trail of job steps and changes. Oldest first: job steps (submitted, admitted,
    started, preempted, moved, finished), cluster changes and every call that changed something
    (kind api: who, from where, the HTTP status); `--kind api` shows only the calls."""
    params: dict[str, Any] = {"team": team, "since": since, "limit": limit, "kind": kind or None}

    def table(data: list[dict[str, Any]]) -> None:
        now = time.time()
        print_table(
            ["TIME", "AGO", "KIND", "TEAM", "JOB", "WHO", "FROM", "STATUS", "MESSAGE"],
            [
                [
                    iso(e["at"]),
                    relative(e["at"], now),
                    e["kind"],
                    e.get("team"),
                    e.get("job_id"),
                    e.get("actor"),
                    e.get("source"),
                    e.get("status"),
                    e["message"],
                ]
                for e in data
            ],
            drop=("FROM", "TIME", "WHO", "STATUS", "TEAM"),
        )

    show(
        server,
        token,
        output,
        lambda c: c.events({k: v for k, v in params.items() if v is not None}),
        table,
    )


def timeline_rows(events: list[dict[str, Any]], now: float) -> list[str]:
    """A job's events as `job describe` prints them: time, how long ago, kind, reason."""
    return [
        f"{iso(e['at'])} ({relative(e['at'], now)})  {e['kind']}: {e['message']}" for e in events
    ]


def register(app: typer.Typer) -> None:
    app.command()(events)
