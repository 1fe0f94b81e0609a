"""Job time limits: the spec, the store, enforcement by the service, and their use in admission
(backfilling onto a node reservation, the node a reservation holds, delay scheduling)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from gpuplane.control import queries
from gpuplane.control.admission import PendingJob, ReservePolicy
from gpuplane.control.delay import MIN_WORK_SAMPLES
from gpuplane.control.estate import Estate
from gpuplane.control.models import Event
from gpuplane.control.quota import QuotaBook
from gpuplane.control.scheduler import Snapshot
from gpuplane.control.service import ControlService
from gpuplane.control.spec import SpecError, format_duration, parse_spec
from gpuplane.control.store import Store
from tests.control.svc_helpers import config, job, make_service, old_store, wait_state

from .sched_helpers import node
from .test_delay import estate as delay_estate
from .test_delay import pending as delay_pending
from .test_delay import run as delay_run
from .test_delay import where as delay_where
from .test_reservation import job as queued_job
from .test_reservation import run

RESERVE = ReservePolicy(after_s=10.0, limit=1)
SPEEDS = {"A100": 1.0, "A10": 0.5}


# -- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(7200, 7200.0), (90.5, 90.5), ("2h", 7200.0), ("90m", 5400.0), ("1h30m", 5400.0),
     ("45s", 45.0), ("1d", 86400.0), ("1.5h", 5400.0), ("600", 600.0)],
)  # fmt: skip
def test_time_limit_takes_seconds_or_a_duration(given: object, seconds: float) -> None:
    spec = parse_spec({"name": "a", "team": "t", "command": ["x"], "time_limit": given})
    assert spec.time_limit == seconds
    assert spec.to_request("j").time_limit_s == seconds


@pytest.mark.parametrize("given", [0, -5, "0s", "2x", "h", "", "soon", True, [1]])
def test_a_bad_time_limit_says_what_is_accepted(given: object) -> None:
    with pytest.raises(SpecError, match=r"time_limit: must be a positive duration.*'90m'"):
        parse_spec({"name": "a", "team": "t", "command": ["x"], "time_limit": given})


def test_no_time_limit_is_no_limit_and_durations_print_as_they_are_read() -> None:
    assert parse_spec({"name": "a", "team": "t", "command": ["x"]}).time_limit is None
    assert [format_duration(s) for s in (45, 5400, 7200, 93600)] == ["45s", "1h30m", "2h", "1d2h"]


# -- the store and the service ---------------------------------------------------------------


def test_upgrading_a_store_gives_old_jobs_no_time_limit(tmp_path: Path) -> None:
    url, _ = old_store(
        tmp_path,
        "0003",
        "INSERT INTO teams (name, cohort, weight) VALUES ('old', NULL, 1.0)",
        "INSERT INTO jobs (id, name, team_name, state, priority, spec, reasons, "
        "milli_gpus, gpu_mem_mib, cpu_millis, memory_mib, attempts, created_at) "
        "VALUES ('j', 'j', 'old', 'succeeded', 0, '{}', '{}', 0, 0, 0, 0, 0, 1.0)",
    )
    store = Store.open(url)
    try:
        with store.engine.connect() as conn:
            row = conn.execute(text("SELECT state, time_limit_s FROM jobs WHERE id = 'j'")).one()
        assert tuple(row) == ("succeeded", None)
    finally:
        store.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = make_service(config(str(tmp_path)))
    yield svc
    svc.close()


def test_a_job_past_its_time_limit_is_stopped_and_fails_saying_why(
    service: ControlService,
) -> None:
    jid = service.submit({**job("slow", gpus=1), "time_limit": "1s"})["id"]
    popen = service.adapters["local"]._runs[jid].popen  # type: ignore[attr-defined]
    row = wait_state(service, jid, "succeeded", "failed", "cancelled")
    assert row.state == "failed"
    assert row.time_limit_s == 1.0
    assert "exceeded its time limit" in (row.message or "")
    assert popen.poll() is not None  # the process was stopped
    assert service.adapters["local"].workloads() == []
    view = queries.get_job(service, jid)
    assert view.time_limit_s == 1.0
    with service.store.session() as session:
        kinds = [e.kind for e in session.scalars(select(Event).where(Event.job_id == jid))]
        messages = list(session.scalars(select(Event.message).where(Event.job_id == jid)))
    assert kinds[-1] == "failed"
    assert "exceeded its time limit" in messages[-1]
    assert queries.list_clusters(service)[0].gpus_free == 2


def test_a_job_within_its_time_limit_is_left_alone(service: ControlService) -> None:
    quick = job("quick", command=["python", "-c", "print(1)"], gpus=1)
    jid = service.submit({**quick, "time_limit": "1h"})["id"]
    assert wait_state(service, jid, "succeeded", "failed").state == "succeeded"


# -- admission: backfilling onto a reserved node ---------------------------------------------


def pending(job_id: str, t: float, limit: float | None = None, **req: Any) -> PendingJob:
    return queued_job(job_id, t, time_limit_s=limit, **req)


def reserved_node(speed_model: str = "A100") -> tuple[Estate, dict[str, PendingJob]]:
    """One 4-card node (of `speed_model`): two cards run a job whose limit ends it at t=1000,
    and a 4-card job that waited since t=1 holds the node from t=20 on."""
    e = Estate.build(
        Snapshot([node("a", cards=4, model=speed_model)], gpu_speeds=SPEEDS), QuotaBook(), []
    )
    jobs = {"x": pending("x", 0.0, 1000.0 * SPEEDS[speed_model], gpus=2)}
    assert [a.job_id for a in run(e, jobs, 0.0, RESERVE).admitted] == ["x"]
    jobs["big"] = pending("big", 1.0, gpus=4)
    run(e, jobs, 20.0, RESERVE)
    assert e.reserved["big"].start_s == 1000.0
    return e, jobs


def test_a_job_whose_limit_ends_before_the_reservation_starts_backfills_onto_its_node() -> None:
    e, jobs = reserved_node()
    jobs["short"] = pending("short", 21.0, 900.0, gpus=1)
    result = run(e, jobs, 30.0, RESERVE)  # ends at 930, before 1000
    assert {a.job_id: a.placement.node for a in result.admitted} == {"short": "a"}
    (held,) = result.reasons["big"]
    assert held["code"] == "Reserved"
    assert held["numbers"]["starts_in_s"] == 970
    assert "jobs whose limits end by then may use the node" in held["message"]
    assert e.reserved["big"].start_s == 1000.0  # the backfilled job does not delay it


@pytest.mark.parametrize("limit", [1000.0, None])
def test_a_job_whose_limit_ends_later_or_that_has_none_is_kept_off_the_reserved_node(
    limit: float | None,
) -> None:
    e, jobs = reserved_node()
    jobs["long"] = pending("long", 21.0, limit, gpus=1)
    result = run(e, jobs, 30.0, RESERVE)  # 30 + 1000 > 1000
    assert result.admitted == []
    (kept,) = result.reasons["long"]
    assert kept["code"] == "BlockedByNomination"
    assert "a (job big)" in kept["message"]
    assert (
        "only jobs whose time limits end before the held jobs' expected starts" in kept["message"]
    )


def test_backfilling_counts_the_limit_at_the_held_nodes_speed() -> None:
    # on an A10 (speed 0.5) a limit of 600 s on an A100 is 1200 s of wall clock: past 1000
    e, jobs = reserved_node("A10")
    jobs["short"] = pending("short", 21.0, 600.0, gpus=1)
    assert run(e, jobs, 30.0, RESERVE).admitted == []
    jobs["shorter"] = pending("shorter", 22.0, 400.0, gpus=1)
    assert [a.job_id for a in run(e, jobs, 31.0, RESERVE).admitted] == ["shorter"]


def test_without_limits_on_the_node_there_is_no_expected_start_and_no_backfill() -> None:
    e = Estate.build(Snapshot([node("a", cards=4)]), QuotaBook(), [])
    jobs = {"x": pending("x", 0.0, gpus=2)}
    run(e, jobs, 0.0, RESERVE)
    jobs["big"] = pending("big", 1.0, gpus=4)
    run(e, jobs, 20.0, RESERVE)
    assert e.reserved["big"].start_s is None
    jobs["short"] = pending("short", 21.0, 1.0, gpus=1)
    assert run(e, jobs, 30.0, RESERVE).admitted == []


def test_the_expected_start_comes_closer_as_the_nodes_jobs_end() -> None:
    e = Estate.build(Snapshot([node("a", cards=4)]), QuotaBook(), [])
    jobs = {"x": pending("x", 0.0, 1000.0, gpus=2), "y": pending("y", 0.0, 500.0, gpus=1)}
    run(e, jobs, 0.0, RESERVE)
    jobs["big"] = pending("big", 1.0, gpus=4)
    run(e, jobs, 20.0, RESERVE)
    assert e.reserved["big"].start_s == 1000.0
    e.release("x")  # ended early: now only y's limit stands between big and the node
    run(e, jobs, 100.0, RESERVE)
    assert e.reserved["big"].start_s == 500.0


# -- admission: delay scheduling weighs a job by its own limit -------------------------------


def test_a_short_job_takes_the_slow_card_and_a_long_one_waits_for_a_fast_one() -> None:
    # four A100 cards busy with one-hour jobs; an A10 is free. Without a limit a job waits
    # (test_delay); with a 10 min limit the A10 costs it at most 10 min, less than the wait
    e = delay_estate()
    assert delay_where(delay_run(e, [delay_pending("short", 10.0, time_limit_s=600.0)])) == {
        "short": "slow"
    }
    e = delay_estate()
    result = delay_run(e, [delay_pending("long", 10.0, time_limit_s=4 * 3600.0)])
    (reason,) = result.reasons["long"]
    assert reason["code"] == "WaitingForFasterGpu"
    assert reason["numbers"] == {"wait_s": 900, "loss_s": 4 * 3600}


def busy_node() -> Estate:
    """A 4-card node with three cards taken by a job with a 5000 s limit: one card free."""
    e = Estate.build(Snapshot([node("a", cards=4)]), QuotaBook(), [])
    run(e, {"busy": pending("busy", 0.0, 5000.0, gpus=3)}, 0.0, RESERVE)
    return e


def queued_behind_a_busy_node() -> tuple[Estate, dict[str, PendingJob]]:
    """`busy_node`; queued: two 100 s jobs, then the newest, of 1000 s. Their 1,200
    card-seconds take the node 300 s: only the 1000 s job reaches past that."""
    e = busy_node()
    jobs = {
        "old": pending("old", 1.0, 100.0, gpus=1),
        "mid": pending("mid", 2.0, 100.0, gpus=1),
        "long": pending("long", 3.0, 1000.0, gpus=1),
    }
    return e, jobs


def test_jobs_whose_limit_reaches_past_the_backlog_go_first_longest_first() -> None:
    e, jobs = queued_behind_a_busy_node()
    assert [a.job_id for a in run(e, jobs, 10.0, RESERVE).admitted] == ["long"]
    e.release("long")
    assert [a.job_id for a in run(e, jobs, 11.0, RESERVE).admitted] == ["old"]  # then fair share


def test_once_jobs_are_seen_to_use_half_their_limits_a_shorter_limit_reaches_past_the_backlog() -> (
    None
):
    # ten 100 s jobs and a 250 s one queue for a 4-card node: by their limits they take it
    # 312 s, and 250 s does not reach past that. Once completed jobs are seen to use half
    # their limits, the backlog is expected to take 156 s, and the 250 s job goes first.
    for learned in (False, True):
        e = busy_node()
        jobs = {f"q{i}": pending(f"q{i}", 1.0 + i, 100.0, gpus=1) for i in range(10)}
        jobs["long"] = pending("long", 20.0, 250.0, gpus=1)
        for _ in range(MIN_WORK_SAMPLES if learned else 0):
            e.work.observe(1800.0, 1.0, limit_run_s=3600.0)
        admitted = [a.job_id for a in run(e, jobs, 30.0, RESERVE).admitted]
        assert admitted == (["long"] if learned else ["q0"])


def test_without_longest_first_the_queue_keeps_fair_share_order_whatever_the_limits() -> None:
    e, jobs = queued_behind_a_busy_node()
    assert [a.job_id for a in run(e, jobs, 10.0, RESERVE, longest_first=False).admitted] == ["old"]
