"""The service on real SQLite with the local adapter: admission, reasons, quota, reclaim, cancel."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpuplane.control.errors import ConflictError, InfeasibleJobError, NotFoundError
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import QuotaConfig, TeamConfig
from gpuplane.control.spec import SpecError
from gpuplane.control.store import queries, team_edits
from gpuplane.control.store.views import TeamSet
from tests.control.svc_helpers import (
    A100,
    assert_no_device_over_allocated,
    config,
    job,
    make_service,
    state,
    wait_state,
)


def test_the_minimal_job_runs_as_a_process_on_a_slice(service: ControlService) -> None:
    out = service.submit(
        job("hello", command=["python", "-c", "print(42)"], gpu_mem_mib=10240, gpu_cores_pct=25)
    )
    row = wait_state(service, out["id"], "succeeded", "failed")
    assert row.state == "succeeded", row.message
    assert row.exit_code == 0
    assert row.flavor == A100
    assert row.cluster_name == "local"
    assert b"".join(queries.job_logs(service, out["id"])) == b"42\n"
    assert_no_device_over_allocated(service)


def test_impossible_requests_are_refused_at_submit_with_the_reason(service: ControlService) -> None:
    with pytest.raises(InfeasibleJobError, match="204800 MiB") as exc:
        service.submit(job("big", gpu_mem_mib=200 * 1024))
    assert exc.value.reasons[0].code == "ExceedsCapacity"
    with pytest.raises(InfeasibleJobError, match="H100") as exc:
        service.submit({**job("h100", gpus=1), "selector": {"gpu_models": ["H100"]}})
    assert exc.value.reasons[0].code == "NoMatchingNode"
    with pytest.raises(InfeasibleJobError):
        service.submit(job("three", gpus=3))
    with pytest.raises(SpecError, match=r"resources\.gpu_cores_pct"):
        service.submit(job("bad", gpu_cores_pct=150))
    with pytest.raises(SpecError, match=r"unknown field 'comand' \(did you mean 'command'\?\)"):
        service.submit({"name": "x", "team": "t", "comand": ["true"]})
    assert queries.list_jobs(service) == []


def test_a_job_that_does_not_fit_now_waits_with_a_reason_per_cluster(
    service: ControlService,
) -> None:
    first = service.submit(job("first", gpus=2))["id"]
    second = service.submit(job("second", gpus=1))["id"]
    assert state(service, first).state == "running"
    view = queries.get_job(service, second)
    assert view.state == "pending"
    assert [(r.cluster, r.code) for r in view.reasons] == [("local", "InsufficientGpus")]
    assert view.queue_position == 1
    assert queries.get_job(service, first).queue_position is None
    dry = service.submit(job("third", gpus=1), dry_run=True)
    assert dry["fits"] is False
    assert dry["queued_ahead"] == 1
    assert dry["reasons"][0].code == "InsufficientGpus"
    service.cancel(first)
    assert wait_state(service, second, "running").cluster_name == "local"
    assert queries.get_job(service, second).reasons == []
    assert_no_device_over_allocated(service)


def test_slices_pack_onto_one_card_and_a_fragmented_request_says_so(
    service: ControlService,
) -> None:
    ids = [
        service.submit(job(f"s{i}", gpu_mem_mib=40 * 1024, gpu_cores_pct=30))["id"]
        for i in range(4)
    ]
    cards = {tuple(queries.get_job(service, i).devices) for i in ids}
    assert all(state(service, i).state == "running" for i in ids)
    assert len(cards) == 2  # two 40 GiB slices per 80 GiB card
    whole = service.submit(job("whole", gpus=1))["id"]
    reasons = queries.get_job(service, whole).reasons
    assert reasons[0].code in ("InsufficientGpus", "Fragmented")
    assert_no_device_over_allocated(service)


def test_quota_holds_a_job_back_with_the_numbers(tmp_path: Path) -> None:
    teams = [TeamConfig(name="research", quotas=[QuotaConfig(flavor=A100, gpus=1)])]
    svc = make_service(config(str(tmp_path), teams=teams))
    try:
        a = svc.submit(job("a", gpus=1))["id"]
        b = svc.submit(job("b", gpus=1))["id"]
        assert state(svc, a).state == "running"
        view = queries.get_job(svc, b)
        assert view.state == "pending"
        assert view.reasons[0].code == "Quota"
        assert "would use 2 GPUs of its nominal 1 GPU on" in view.reasons[0].message
        team = queries.get_team(svc, "research")
        assert team.quotas[0].used_gpus == 1.0
        assert team.pending_jobs == 1
    finally:
        svc.close()


def test_owner_reclaims_borrowed_cards_by_preempting_the_borrower(tmp_path: Path) -> None:
    teams = [
        TeamConfig(name="owner", cohort="ml", quotas=[QuotaConfig(flavor=A100, gpus=2)]),
        TeamConfig(name="guest", cohort="ml", quotas=[QuotaConfig(flavor=A100, gpus=0)]),
    ]
    svc = make_service(config(str(tmp_path), teams=teams))
    try:
        g1 = svc.submit(job("g1", team="guest", gpus=1))["id"]
        g2 = svc.submit(job("g2", team="guest", gpus=1))["id"]
        assert state(svc, g1).state == state(svc, g2).state == "running"
        mine = svc.submit(job("mine", team="owner", gpus=1))["id"]
        assert state(svc, mine).state in ("admitted", "running")
        victim = state(svc, g2)  # the newest borrower job goes first
        assert victim.state == "pending"
        assert victim.attempts == 1
        assert "preempted" in (victim.message or "")
        assert state(svc, g1).state == "running"
        svc.schedule_pass()
        assert queries.get_job(svc, g2).reasons[0].code == "Quota"  # the cohort is full now
        assert_no_device_over_allocated(svc)
    finally:
        svc.close()


def test_higher_priority_goes_first(service: ControlService) -> None:
    team_edits.set_team(service, "other", TeamSet())  # a job must name a declared team
    blocker = service.submit(job("blocker", gpus=2))["id"]
    low = service.submit({**job("low", gpus=2), "priority": 0})["id"]
    high = service.submit({**job("high", team="other", gpus=2), "priority": 10})["id"]
    service.cancel(blocker)
    service.tick()
    assert state(service, high).state in ("admitted", "running")
    assert state(service, low).state == "pending"


def test_cancel_stops_the_process_and_frees_the_card(service: ControlService) -> None:
    jid = service.submit(job("sleeper", gpus=1))["id"]
    assert state(service, jid).state == "running"
    popen = service.adapters["local"]._runs[jid].popen  # type: ignore[attr-defined]
    service.cancel(jid)
    assert popen.poll() is not None
    assert state(service, jid).state == "cancelled"
    with pytest.raises(ConflictError, match="already ended"):
        service.cancel(jid)
    with pytest.raises(NotFoundError, match="gpuplane job list"):
        service.cancel("nope")
    assert queries.list_clusters(service)[0].gpus_free == 2


def test_a_failing_command_fails_the_job_with_its_exit_code(service: ControlService) -> None:
    jid = service.submit(job("fails", command=["python", "-c", "raise SystemExit(7)"], gpus=1))[
        "id"
    ]
    row = wait_state(service, jid, "succeeded", "failed")
    assert (row.state, row.exit_code) == ("failed", 7)
    bad = service.submit(job("missing", command=["no-such-binary-xyz"], gpus=1))["id"]
    row = state(service, bad)
    assert row.state == "failed"
    assert "cannot start" in (row.message or "")
    assert_no_device_over_allocated(service)


def test_a_restarted_service_sees_the_store_and_fails_jobs_killed_meanwhile(tmp_path: Path) -> None:
    cfg = config(str(tmp_path))
    first = make_service(cfg)
    jid = first.submit(job("survivor", gpus=1))["id"]
    pid = first.adapters["local"]._runs[jid].record.pid  # type: ignore[attr-defined]
    first.store.close()  # as if it crashed, and the job was killed with its wrapper meanwhile
    os.killpg(pid, signal.SIGKILL)
    second = make_service(cfg)
    try:
        row = wait_state(second, jid, "failed")
        assert "gone without recording an exit code" in (row.message or "")
        assert queries.list_clusters(second)[0].gpus_free == 2
    finally:
        second.close()


def test_two_service_processes_observe_only_the_jobs_they_started(tmp_path: Path) -> None:
    cfg = config(str(tmp_path))
    a, b = make_service(cfg, "a"), make_service(cfg, "b")
    try:
        jid = a.submit(job("mine", gpus=1))["id"]
        assert state(a, jid).bound_by == "a"
        b.tick()  # b does not know the process, but it is not b's to judge
        assert state(b, jid).state == "running"
        popen = a.adapters["local"]._runs[jid].popen  # type: ignore[attr-defined]
        b.cancel(jid)  # cancelled through the other process ...
        a.tick()  # ... the one that started it stops it on its next round
        assert popen.poll() is not None
        assert a.adapters["local"].workloads() == []
        assert state(a, jid).state == "cancelled"
    finally:
        a.close()
        b.close()


def test_queued_jobs_share_the_cards_by_team_weight(tmp_path: Path) -> None:
    """Dominant-resource fair share: with weight 3 against 1, team b gets 3 of the 4 cards."""
    teams = [TeamConfig(name="a"), TeamConfig(name="b", weight=3.0)]
    svc = make_service(config(str(tmp_path), nodes=2, gpus=2, teams=teams))
    try:
        svc.submit_many([job(f"a{i}", team="a", gpus=1) for i in range(4)], admit=False)
        svc.submit_many([job(f"b{i}", team="b", gpus=1) for i in range(4)], admit=False)
        assert svc.schedule_pass() == 4
        running = [j for j in queries.list_jobs(svc) if j.state in ("admitted", "running")]
        assert sorted(j.team for j in running) == ["a", "b", "b", "b"]
        shares = {t.name: t.dominant_share for t in queries.list_teams(svc)}
        assert shares == {"a": 0.25, "b": 0.25}  # equal once divided by the weights
    finally:
        svc.close()


def test_a_pass_is_skipped_while_nothing_changed(service: ControlService) -> None:
    blocker = service.submit(job("blocker", gpus=2))["id"]
    waiting = service.submit(job("waiting", gpus=1))["id"]
    passes = next(iter(service.metrics.pass_seconds.collect())).samples
    count = next(s.value for s in passes if s.name.endswith("_count"))
    for _ in range(3):
        service.tick()  # binding the blocker does not make room: no pass runs
    passes = next(iter(service.metrics.pass_seconds.collect())).samples
    assert next(s.value for s in passes if s.name.endswith("_count")) == count
    service.cancel(blocker)  # room: the next tick runs a pass and admits the waiting job
    service.tick()
    assert state(service, waiting).state == "running"


def test_concurrent_binders_and_reconcilers_never_kill_a_fresh_job(tmp_path: Path) -> None:
    """The API thread (submit) and the loop thread (tick) bind and reconcile at the same time."""
    import threading

    from gpuplane.control.service.service import ControlService as Service

    cfg = config(str(tmp_path), nodes=1, gpus=8)
    svc = Service(cfg, bind_on_submit=False)
    svc.start()
    try:
        ids = [svc.submit(job(f"j{i}", gpus=1))["id"] for i in range(8)]
        barrier = threading.Barrier(4)

        def work(k: int) -> None:
            barrier.wait()
            for _ in range(3):
                (svc.bind_admitted if k % 2 else svc.reconcile)()

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        svc.tick()
        assert [state(svc, i).state for i in ids] == ["running"] * 8
        assert sorted(svc.adapters["local"].workloads()) == sorted(ids)
    finally:
        svc.close()
