"""`gpuplane usage` through the control API (`GET /usage`): GPU-hours per team from the
allocations in a live control plane's store, reconciled with them (a slice counts its share of a
card), idle apart where the server's audit samples exist, a member shown only its team."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from gpuplane.audit.sample_store import SampleStore
from gpuplane.audit.settings import AuditSettings
from gpuplane.control.identity.auth import Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import TeamConfig
from gpuplane.control.store.models import Job
from tests.audit.audit_helpers import T0, concat, series
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import SLEEP, config, job, make_service, wait_state

HOUR = 3600


PRICES = AuditSettings(prices={"A100-80GB": 2.0})


def service(tmp_path: Path, samples_dir: Path | None = None) -> ControlService:
    teams = (TeamConfig(name="research"), TeamConfig(name="vision"))
    cfg = config(str(tmp_path), gpus=2, teams=teams)
    return make_service(cfg.model_copy(update={"samples_dir": samples_dir and str(samples_dir)}))


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ControlService]:
    s = service(tmp_path)
    yield s
    s.close()


@pytest.fixture
def url(svc: ControlService) -> Iterator[str]:
    with serving(svc, PRICES) as u:
        yield u


def held(service: ControlService, spans: list[tuple[str, dict[str, Any], float, float]]) -> None:
    """Run one job per span until it is placed, end it, then set the store's start and end to
    the span's: what a control plane that ran them then would hold."""
    ids = []
    for i, (team, resources, _, _) in enumerate(spans):
        ids.append(service.submit(job(f"j{i}", team=team, command=SLEEP, **resources))["id"])
    for job_id in ids:
        wait_state(service, job_id, "running")
        service.cancel(job_id)
        wait_state(service, job_id, "cancelled", "failed")
    with service.store.session() as session:
        for job_id, (_, _, start, end) in zip(ids, spans, strict=True):
            session.execute(
                update(Job).where(Job.id == job_id).values(started_at=start, finished_at=end)
            )
        session.commit()


def run(url: str, *args: str, token: str | None = None) -> tuple[int, str]:
    """`gpuplane usage ARGS` against the control plane at `url` as `token` (default: its admin):
    the exit code and what it printed."""
    return cli(url, "usage", *args, token=token)


def report(url: str, *args: str, token: str | None = None) -> dict[str, Any]:
    code, out = run(url, "-o", "json", *args, token=token)
    assert code == 0, out
    data: dict[str, Any] = json.loads(out)
    return data


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


QUARTER = {"gpu_mem_mib": 20480, "gpu_cores_pct": 25}


def test_four_quarter_slices_for_an_hour_are_one_gpu_hour(svc: ControlService, url: str) -> None:
    teams = ["research", "vision", "research", "vision"]
    held(svc, [(t, QUARTER, T0, T0 + HOUR) for t in teams])
    window = ["--since", iso(T0 - HOUR), "--until", iso(T0 + 2 * HOUR)]
    data = report(url, *window)
    by_team = {t["team"]: t for t in data["teams"]}
    assert by_team["research"]["gpu_hours"] == pytest.approx(0.5)
    assert by_team["vision"]["gpu_hours"] == pytest.approx(0.5)
    assert by_team["research"]["slice_hours"] == pytest.approx(4.0)  # 8 slices a card
    assert by_team["research"]["cost"] == pytest.approx(1.0)  # 0.5 GPU-hour at 2.0
    # no audit samples: what the jobs used is unknown, not zero
    assert by_team["research"]["idle_gpu_hours"] is None
    assert data["physical_gpu_hours"] == pytest.approx(6.0)  # 2 cards x 3 hours
    assert data["free_gpu_hours"] == pytest.approx(5.0)
    assert data["reconciled"]
    only = report(url, *window, "--team", "vision")
    assert [t["team"] for t in only["teams"]] == ["vision"]


def test_a_member_sees_its_own_teams_usage_only(svc: ControlService, url: str) -> None:
    held(svc, [("research", QUARTER, T0, T0 + HOUR), ("vision", QUARTER, T0, T0 + HOUR)])
    member = svc.tokens.create("usage", Role.member, "vision")[1]
    window = ["--since", iso(T0), "--until", iso(T0 + HOUR)]
    mine = report(url, *window, token=member)
    assert [t["team"] for t in mine["teams"]] == ["vision"]
    code, theirs = run(url, *window, "--team", "research", token=member)
    assert code == 1
    assert "HTTP 404" in theirs
    assert "no team 'research'" in theirs
    assert run(url, *window, token="gpl_nonsense")[0] == 1


def test_the_report_reconciles_with_the_store_for_uneven_spans(
    svc: ControlService, url: str
) -> None:
    rng = random.Random(0)
    spans = []
    for i in range(6):
        start = T0 + rng.uniform(0, HOUR)
        resources = QUARTER if i % 3 else {"gpu_mem_mib": 40960, "gpu_cores_pct": 50}
        spans.append(("research", resources, start, start + rng.uniform(HOUR, 3 * HOUR)))
    held(svc, spans)
    # the allocations as the store holds them, in exact interval arithmetic
    since, until = T0, T0 + 3 * HOUR
    expected = sum(
        (min(end, until) - max(start, since))
        / HOUR
        * max(r["gpu_mem_mib"] / 81920, r["gpu_cores_pct"] / 100)
        for _, r, start, end in spans
    )
    data = report(url, "--since", iso(since), "--until", iso(until), "--step", "10s")
    got = sum(t["gpu_hours"] for t in data["teams"])
    assert got == pytest.approx(expected, rel=0.01)
    assert data["reconciled"]


def test_audit_samples_add_used_and_idle_apart(tmp_path: Path) -> None:
    svc = service(tmp_path, tmp_path / "samples")
    try:
        held(svc, [("research", QUARTER, T0, T0 + HOUR), ("vision", QUARTER, T0, T0 + HOUR)])
        with svc.store.session() as session:
            research, vision = session.query(Job.id).order_by(Job.name).all()
        minutes = HOUR // 60
        SampleStore(tmp_path / "samples").append(
            concat(
                series(research[0], [1000.0] * minutes, [0.0] * minutes, start=T0),  # idle
                series(vision[0], [1000.0] * minutes, [0.2] * minutes, start=T0),
            )
        )
        with serving(svc, PRICES) as url:
            data = report(url, "--since", iso(T0), "--until", iso(T0 + HOUR))
    finally:
        svc.close()
    by_team = {t["team"]: t for t in data["teams"]}
    assert by_team["research"]["idle_gpu_hours"] == pytest.approx(0.25)
    assert by_team["research"]["used_gpu_hours"] == pytest.approx(0.0)
    assert by_team["vision"]["idle_gpu_hours"] == pytest.approx(0.0)
    assert by_team["vision"]["used_gpu_hours"] == pytest.approx(0.2)
    assert by_team["vision"]["measured_gpu_hours"] == pytest.approx(0.25)


def test_a_wrong_window_says_what_to_do(url: str) -> None:
    for args, message in (
        (("--since", "1h", "--until", "2h"), "is not before until"),
        (("--since", "last week"), "neither a duration"),
        (("--since", "3000d", "--step", "1s"), "a longer step"),
    ):
        code, out = run(url, *args)
        assert code == 1, args
        assert message in out
    ahead = report(url, "--since", "1h", "--until", "2999-01-01")
    assert datetime.fromisoformat(ahead["until"]) <= datetime.now(UTC)
    code, table = run(url, "--since", "1h")
    assert code == 0, table
    assert "TEAM" in table
    assert "physical" in table
    assert run("http://127.0.0.1:9", "--since", "1h")[0] == 1
