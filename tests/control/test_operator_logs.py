"""The control plane tells its operator what it did to each job, one structured log line per
event (logger `gpuplane.control`): admitted, started, finished with the exit code, preempted,
cancelled, each with job id, team, cluster and reason; and on start, what it took back."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuplane.control.settings import QuotaConfig, TeamConfig
from tests.control.svc_helpers import A100, config, job, make_service, wait_state


def about(caplog: pytest.LogCaptureFixture, key: str, value: object) -> list[dict[str, Any]]:
    """The structured fields (and `text`) of each control log record whose `key` is `value`."""
    return [
        {**vars(r), "text": r.getMessage()}
        for r in caplog.records
        if r.name == "gpuplane.control" and vars(r).get(key) == value
    ]


def events(caplog: pytest.LogCaptureFixture, job_id: str) -> list[tuple[str, str, str, str]]:
    """(event, team, cluster, reason) of each log record about `job_id`, in order."""
    return [
        (r["event"], r["team"], r["cluster"], r["reason"]) for r in about(caplog, "job_id", job_id)
    ]


def test_each_job_event_is_logged_with_its_job_team_cluster_and_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    teams = [
        TeamConfig(name="owner", cohort="ml", quotas=[QuotaConfig(flavor=A100, gpus=2)]),
        TeamConfig(name="guest", cohort="ml", quotas=[QuotaConfig(flavor=A100, gpus=0)]),
    ]
    cfg = config(str(tmp_path), teams=teams)
    caplog.set_level(logging.INFO, logger="gpuplane.control")
    svc = make_service(cfg, "ops")
    try:
        g1 = svc.submit(job("g1", team="guest", gpus=1))["id"]
        g2 = svc.submit(job("g2", team="guest", gpus=1))["id"]
        mine = svc.submit(job("mine", team="owner", gpus=1))["id"]  # reclaims g2's card
        quick = [sys.executable, "-c", "raise SystemExit(4)"]
        four = svc.submit(job("four", team="owner", command=quick))["id"]
        assert wait_state(svc, four, "failed").exit_code == 4
        svc.cancel(g1)
    finally:
        svc.close(stop_jobs=False)  # leaves `mine` running for the restart below

    assert events(caplog, g1) == [
        ("admitted", "guest", "local", "placed on local/n0 (A100-80GB)"),
        ("started", "guest", "local", "bound by ops on n0"),
        ("cancelled", "guest", "local", "cancelled by a user"),
    ]
    assert events(caplog, g2)[2] == (
        "preempted",
        "guest",
        "local",
        "its team's borrowed quota was reclaimed; requeued",
    )
    assert [e[0] for e in events(caplog, mine)] == ["admitted", "started"]
    assert [e[0] for e in events(caplog, four)] == ["admitted", "started", "finished"]
    finished = about(caplog, "job_id", four)[2]
    assert (finished["state"], finished["exit_code"]) == ("failed", 4)
    assert finished["text"] == (
        f"job {four} finished (team owner, cluster local, exit code 4): exited with code 4"
    )

    caplog.clear()
    again = make_service(cfg, "ops")
    try:
        (summary,) = about(caplog, "event", "reconciled")
        assert summary["text"] == (
            "reconciled on start: adopted 1 running jobs, recorded 0 exits while down, 0 lost"
        )
        assert (summary["adopted"], summary["exited"], summary["lost"]) == (1, 0, 0)
    finally:
        again.close()
