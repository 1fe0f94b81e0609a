"""Queue sort (pure): priority, then fair share (smallest dominant share, oldest), with time
limits the jobs that reach past the backlog's horizon first, longest first."""

from __future__ import annotations

from gpuplane.control.admission import MIN_WORK_SAMPLES, AdmissionQueue, Estate, PendingJob
from gpuplane.control.scheduler import Request
from tests.control.scheduler.sched_helpers import node

from .helpers import NOMINATE, estate, job, run


def test_queue_orders_by_priority_then_smallest_dominant_share_then_fifo() -> None:
    usage = {"a": 0.0, "b": 0.0, "c": 0.0}
    jobs = [
        PendingJob("a1", "a", 0, 1.0, Request("a1")),
        PendingJob("a2", "a", 0, 2.0, Request("a2")),
        PendingJob("a3", "a", 0, 3.0, Request("a3")),
        PendingJob("b1", "b", 0, 4.0, Request("b1")),
        PendingJob("hi", "c", 5, 9.0, Request("hi")),
    ]
    order = []
    for queued in AdmissionQueue(jobs, lambda t: usage[t]):
        order.append(queued.job_id)
        usage[queued.team] += 0.1  # each admission raises the team's share
    assert order == ["hi", "a1", "b1", "a2", "a3"]


def test_fair_share_alternates_between_teams_with_equal_priority() -> None:
    e = estate(node("n1", cards=4))
    jobs = {f"a{i}": job(f"a{i}", float(i), team="a", gpus=1) for i in range(4)}
    jobs |= {f"b{i}": job(f"b{i}", 10.0 + i, team="b", gpus=1) for i in range(4)}
    result = run(e, jobs, 100.0, None)
    assert sorted(a.job_id for a in result.admitted) == ["a0", "a1", "b0", "b1"]


# -- with time limits: longest first past the backlog's horizon ------------------------------


def busy_node() -> Estate:
    """A 4-card node with three cards taken by a job with a 5000 s limit: one card free."""
    e = estate(node("a", cards=4))
    run(e, {"busy": job("busy", 0.0, limit=5000.0, gpus=3)}, 0.0, NOMINATE)
    return e


def queued_behind_a_busy_node() -> tuple[Estate, dict[str, PendingJob]]:
    """`busy_node`; queued: two 100 s jobs, then the newest, of 1000 s. Their 1,200
    card-seconds take the node 300 s: only the 1000 s job reaches past that."""
    e = busy_node()
    jobs = {
        "old": job("old", 1.0, limit=100.0, gpus=1),
        "mid": job("mid", 2.0, limit=100.0, gpus=1),
        "long": job("long", 3.0, limit=1000.0, gpus=1),
    }
    return e, jobs


def test_jobs_whose_limit_reaches_past_the_backlog_go_first_longest_first() -> None:
    e, jobs = queued_behind_a_busy_node()
    assert [a.job_id for a in run(e, jobs, 10.0, NOMINATE).admitted] == ["long"]
    e.release("long")
    assert [a.job_id for a in run(e, jobs, 11.0, NOMINATE).admitted] == ["old"]  # then fair share


def test_once_jobs_are_seen_to_use_half_their_limits_a_shorter_limit_reaches_past_the_backlog() -> (
    None
):
    # ten 100 s jobs and a 250 s one queue for a 4-card node: by their limits they take it
    # 312 s, and 250 s does not reach past that. Once completed jobs are seen to use half
    # their limits, the backlog is expected to take 156 s, and the 250 s job goes first.
    for learned in (False, True):
        e = busy_node()
        jobs = {f"q{i}": job(f"q{i}", 1.0 + i, limit=100.0, gpus=1) for i in range(10)}
        jobs["long"] = job("long", 20.0, limit=250.0, gpus=1)
        for _ in range(MIN_WORK_SAMPLES if learned else 0):
            e.work.observe(1800.0, 1.0, limit_run_s=3600.0)
        admitted = [a.job_id for a in run(e, jobs, 30.0, NOMINATE).admitted]
        assert admitted == (["long"] if learned else ["q0"])


def test_without_longest_first_the_queue_keeps_fair_share_order_whatever_the_limits() -> None:
    e, jobs = queued_behind_a_busy_node()
    admitted = run(e, jobs, 10.0, NOMINATE, longest_first=False).admitted
    assert [a.job_id for a in admitted] == ["old"]
