"""Operator log lines of the control plane: one per job event, readable, with its fields as data.

Logger `gpuplane.control`; under `gpuplane.logs.configure` (what `control serve` runs) each line
is a JSON object with `event`, `job_id`, `team`, `cluster`, `reason` and, for a job that ended,
`state` and `exit_code`. Emitted after the store committed the change it reports.
"""

from __future__ import annotations

import logging

log = logging.getLogger("gpuplane.control")


def job_event(
    event: str,
    job_id: str,
    *,
    team: str | None,
    cluster: str | None,
    reason: str,
    state: str | None = None,
    exit_code: int | None = None,
    level: int = logging.INFO,
) -> None:
    """Log job `event` (admitted, started, finished, preempted, cancelled) and why."""
    code = "" if exit_code is None else f", exit code {exit_code}"
    log.log(
        level,
        "job %s %s (team %s, cluster %s%s): %s",
        job_id,
        event,
        team,
        cluster,
        code,
        reason,
        extra={
            "event": event,
            "job_id": job_id,
            "team": team,
            "cluster": cluster,
            "reason": reason,
            "state": state,
            "exit_code": exit_code,
        },
    )
