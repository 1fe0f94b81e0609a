"""Delay scheduling for faster GPUs: wait for a fast card expected in time, else take a slow one."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplane.control.admission import (
    MIN_WORK_SAMPLES,
    Estate,
    PassResult,
    PendingJob,
    WorkHistory,
    run_pass,
)
from gpuplane.control.admission.quota import QuotaBook
from gpuplane.control.scheduler import ReasonCode, Request, Snapshot, make_policy
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ClusterConfig, DeclaredGpus, DeclaredNode
from gpuplane.resources import LABEL_GPU_SPEED, Selector
from tests.control.scheduler.sched_helpers import node
from tests.control.svc_helpers import config, job, make_service, state, wait_state

SPEEDS = {"A100": 1.0, "L40S": 0.8, "A10": 0.5}


def estate(fast_busy: int = 4, samples: int = MIN_WORK_SAMPLES, l40s: bool = False) -> Estate:
    """A 4-card A100 node with `fast_busy` cards taken by running 1-card jobs (and with `l40s`
    a 4-card L40S node full of them), a free 4-card A10 node, and `samples` completed jobs of
    one hour on an A100."""
    nodes = [node("fast", cards=4, cluster="east"), node("slow", 4, model="A10", cluster="south")]
    if l40s:
        nodes.append(node("mid", cards=4, model="L40S", cluster="west"))
    e = Estate.build(Snapshot(nodes, gpu_speeds=SPEEDS), QuotaBook(), [])
    for k in range(fast_busy):
        run(e, [pending(f"r{k}", 0.0, models=("A100",))])
    for k in range(4 if l40s else 0):
        run(e, [pending(f"m{k}", 0.0, models=("L40S",))])
    for _ in range(samples):
        e.work.observe(3600.0, 1.0)
    return e


def pending(job_id: str, t: float, models: tuple[str, ...] = (), **req: Any) -> PendingJob:
    selector = Selector(gpu_models=frozenset(models))
    return PendingJob(job_id, "t", 0, t, Request(job_id, gpus=1, selector=selector, **req))


def run(e: Estate, jobs: list[PendingJob], wait: bool = True, now: float = 100.0) -> PassResult:
    return run_pass(e, jobs, make_policy(), np.random.default_rng(0), now, None, wait)


def where(result: PassResult) -> dict[str, str]:
    return {a.job_id: a.placement.node for a in result.admitted}


def test_a_job_waits_for_a_fast_card_expected_to_free_in_time() -> None:
    e = estate()
    result = run(e, [pending("j", 10.0)])
    assert result.admitted == []
    (reason,) = result.reasons["j"]
    assert reason.code == ReasonCode.WAITING_FOR_FASTER_GPU
    assert reason.cluster == "east"
    assert "would run on A10 now, but A100" in reason.message
    # four busy A100 cards with an hour of work each free one every 15 min; an A10 adds an hour
    assert reason.numbers == {"wait_s": 900, "loss_s": 3600}


def limited_estate(limit_s: float, fill: float = 1.0) -> Estate:
    """`estate()` with the four A100 jobs given time limits of `limit_s`, admitted at 100 s;
    completed jobs used `fill` of their limits (1.0: too few yet to tell)."""
    e = estate(fast_busy=0)
    for k in range(4):
        run(e, [pending(f"r{k}", 0.0, models=("A100",), time_limit_s=limit_s)])
    if fill < 1.0:
        for _ in range(MIN_WORK_SAMPLES):
            e.work.observe(3600.0 * fill, 1.0, limit_run_s=3600.0)
    return e


def test_running_jobs_with_time_limits_free_the_fast_cards_when_their_limits_say() -> None:
    # the A10 would cost a job one hour: it waits only if an A100 job is expected to end by then
    assert where(run(limited_estate(10 * 3600.0), [pending("j", 10.0)])) == {"j": "slow"}
    assert run(limited_estate(1800.0), [pending("j", 10.0)]).admitted == []
    # a 2 h limit of which jobs are seen to use a quarter: expected to end after 30 min
    assert where(run(limited_estate(7200.0), [pending("j", 10.0)])) == {"j": "slow"}
    assert run(limited_estate(7200.0, fill=0.25), [pending("j", 10.0)]).admitted == []


def test_when_the_wait_is_long_the_slow_card_is_taken() -> None:
    # four busy A100 cards free four within the hour an A10 would lose: the first four jobs in
    # the queue wait for them, the fifth would wait longer and starts on an A10 now
    e = estate()
    jobs = [pending(f"j{k}", 10.0 + k) for k in range(5)]
    result = run(e, jobs)
    assert where(result) == {"j4": "slow"}
    for k in range(4):
        assert result.reasons[f"j{k}"][0].code == ReasonCode.WAITING_FOR_FASTER_GPU


def test_a_job_waits_no_longer_than_the_slow_card_would_lose() -> None:
    e = estate()
    job = pending("j", 10.0)
    assert run(e, [job]).admitted == []
    assert run(e, [job], now=100.0 + 3600.0).admitted == []  # an hour: what an A10 loses
    assert where(run(e, [job], now=100.0 + 3601.0)) == {"j": "slow"}  # patience exhausted
    assert e.delayed == {}


def test_a_job_that_leaves_the_queue_is_forgotten() -> None:
    e = estate()
    run(e, [pending("j", 10.0)])
    assert e.delayed == {"j": 100.0}
    run(e, [])
    assert e.delayed == {}


def test_the_faster_models_are_pooled_a_job_waits_for_whichever_frees_first() -> None:
    # A100s and L40Ss free 7.2 cards' worth of work per hour; within the 45 min an L40S still
    # gains over an A10 that is 5.4 cards: five jobs wait, the sixth starts on an A10
    e = estate(l40s=True)
    result = run(e, [pending(f"j{k}", 10.0 + k) for k in range(6)])
    assert where(result) == {"j5": "slow"}


def test_long_jobs_in_the_history_widen_the_window() -> None:
    # of five jobs, the fifth took an A10 with one-hour jobs only; when some jobs run far longer
    # than the mean all five wait: on a slow card a long job is what stretches the makespan
    e = estate(samples=0)
    for work in [1800.0] * 6 + [3 * 3600.0] * 2:
        e.work.observe(work, 1.0)
    result = run(e, [pending(f"j{k}", 10.0 + k) for k in range(5)])
    assert result.admitted == []


def test_no_waiting_before_enough_jobs_completed() -> None:
    e = estate(samples=MIN_WORK_SAMPLES - 1)
    assert where(run(e, [pending("j", 10.0)])) == {"j": "slow"}


def test_off_it_never_waits() -> None:
    assert where(run(estate(), [pending("j", 10.0)], wait=False)) == {"j": "slow"}


def test_a_fast_card_free_now_is_taken_when_the_slow_one_would_lose() -> None:
    e = estate(fast_busy=3)  # one A100 card free
    result = run(e, [pending("j", 10.0)])
    assert where(result) == {"j": "fast"}


def test_a_job_that_may_only_use_the_slow_model_never_waits() -> None:
    assert where(run(estate(), [pending("j", 10.0, models=("A10",))])) == {"j": "slow"}


def test_a_short_job_takes_the_slow_card_and_a_long_one_waits_for_a_fast_one() -> None:
    # four A100 cards busy with one-hour jobs; an A10 is free. Without a limit a job waits
    # (above); with a 10 min limit the A10 costs it at most 10 min, less than the wait
    e = estate()
    assert where(run(e, [pending("short", 10.0, time_limit_s=600.0)])) == {"short": "slow"}
    e = estate()
    result = run(e, [pending("long", 10.0, time_limit_s=4 * 3600.0)])
    (reason,) = result.reasons["long"]
    assert reason.code == "WaitingForFasterGpu"
    assert reason.numbers == {"wait_s": 900, "loss_s": 4 * 3600}


def test_work_history_is_a_mean_of_run_time_times_speed() -> None:
    history = WorkHistory()
    assert not history.ready
    for _ in range(MIN_WORK_SAMPLES):
        history.observe(7200.0, 0.5)
    assert history.ready
    assert history.mean_s == 3600.0


def test_work_history_learns_what_share_of_their_time_limits_jobs_use() -> None:
    history = WorkHistory()
    for _ in range(MIN_WORK_SAMPLES - 1):
        history.observe(3600.0, 0.5, limit_run_s=14_400.0)  # 1 h of a 4 h limit
    history.observe(3600.0, 0.5)  # without a limit: not counted
    assert history.limit_fill() == 1.0  # too few yet: limits are taken at their word
    history.observe(3600.0, 0.5, limit_run_s=14_400.0)
    assert history.limit_fill() == 0.25
    history.observe(14_400.0, 0.5, limit_run_s=7200.0)  # past its limit: never above 1
    assert 0.25 < history.limit_fill() <= 1.0


def test_a_completed_job_teaches_the_estate_its_work() -> None:
    e = estate(fast_busy=0, samples=0)
    run(e, [pending("j", 0.0, models=("A10",))])
    e.release("j", ended_at=100.0 + 7200.0)  # admitted at 100 s, ran 2 h on an A10
    assert (e.work.samples, e.work.mean_s) == (1, 3600.0)
    e.release("j", ended_at=1e9)  # idempotent: already released, nothing learned
    assert e.work.samples == 1
    assert e.work.limited == 0
    run(e, [pending("k", 0.0, models=("A10",), time_limit_s=4 * 3600.0)])
    e.release("k", ended_at=100.0 + 3600.0)  # 4 h of A100 time: 8 h on an A10; it ran 1 h
    assert (e.work.limited, e.work.limited_work_s, e.work.limited_limit_s) == (1, 1800.0, 14_400.0)


def _two_speed_config(tmp: str) -> Any:
    def cluster(name: str, model: str, speed: str) -> ClusterConfig:
        gpu = DeclaredGpus(model=model, mem_mib=24 * 1024, count=1)
        declared = DeclaredNode(name="n0", cpu_millis=8000, memory_mib=32 * 1024, gpus=[gpu])
        return ClusterConfig(
            name=name, discover_gpus=False, nodes=[declared], labels={LABEL_GPU_SPEED: speed}
        )

    return config(tmp, clusters=[cluster("fast", "A100", "1.0"), cluster("slow", "A10", "0.5")])


def test_the_service_learns_from_completed_jobs_and_waits_for_the_fast_card(tmp_path: Any) -> None:
    service: ControlService = make_service(_two_speed_config(str(tmp_path)))
    try:
        for k in range(MIN_WORK_SAMPLES):  # completed jobs: what the service learns from
            spec = job(f"done{k}", command=["true"], gpus=1)
            if k == 0:  # with a limit: the share of it the job used is learned too
                spec["time_limit"] = "1h"
            out = service.submit(spec)
            assert wait_state(service, out["id"], "succeeded").state == "succeeded"
        estate, _ = service.estate()
        assert estate.work.samples == MIN_WORK_SAMPLES
        assert (estate.work.limited, estate.work.limited_limit_s) == (1, 3600.0)
        spec = {**job("busy", gpus=1), "selector": {"gpu_models": ["A100"]}}
        busy = service.submit(spec)["id"]
        assert wait_state(service, busy, "running").cluster_name == "fast"
        waiting = service.submit(job("x", gpus=1))["id"]
        row = state(service, waiting)
        assert row.state == "pending"
        assert [r["code"] for r in row.reasons["list"]] == ["WaitingForFasterGpu"]
        service.cancel(busy)
        assert wait_state(service, waiting, "running").cluster_name == "fast"
        service.cancel(waiting)
    finally:
        service.close()
