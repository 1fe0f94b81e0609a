"""Cluster lifecycle and health on the service, with `local` clusters on real SQLite: clusters
added at run time are stored and survive a restart; cordon, drain and remove; a cluster that
stops answering is avoided, its unbound jobs re-placed, its running jobs shown `unknown` and
reconciled when it returns, and a stray copy of a re-placed job is stopped there."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuplane.control.adapters import AdapterError, Inventory
from gpuplane.control.adapters.base import ClusterAdapter, create_adapter
from gpuplane.control.adapters.local import LocalAdapter
from gpuplane.control.errors import ConflictError, NotFoundError
from gpuplane.control.service.runtime import _workload
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import (
    ClusterConfig,
    ControlConfig,
)
from gpuplane.control.store import queries
from gpuplane.control.store.models import Job
from gpuplane.errors import ConfigError
from tests.control.svc_helpers import config, job, local_cluster, state, wait_state


def local(name: str, gpus: int = 2, region: str = "local") -> ClusterConfig:
    return local_cluster(name, gpus, region=region)


class Flaky(LocalAdapter):
    """A local cluster whose API can be made to stop answering (`why` set)."""

    why: str | None = None

    def reachable(self) -> tuple[bool, str]:
        return self.why is None, self.why or ""

    def inventory(self) -> Inventory:
        if self.why is not None:
            raise AdapterError(f"cluster {self.cluster.name}: {self.why}")
        return super().inventory()


def flaky_factory(cluster: ClusterConfig, control: ControlConfig) -> ClusterAdapter:
    if cluster.name == "flaky":
        return Flaky(cluster, control)
    return create_adapter(cluster, control)


def started(
    cfg: ControlConfig, *, bind_on_submit: bool = True, clock: Callable[[], float] = time.time
) -> ControlService:
    service = ControlService(cfg, bind_on_submit=bind_on_submit, clock=clock)
    service.clusters.factory = flaky_factory
    service.start()
    return service


@pytest.fixture
def two(tmp_path: Path) -> Iterator[ControlService]:
    """Clusters `a` (gpuplane.yaml) and `b` (added at run time), 2 cards each."""
    service = started(config(str(tmp_path), clusters=[local("a")]))
    service.add_cluster(local("b"))
    yield service
    service.close()


def on(cluster: str, name: str, gpus: int) -> dict[str, object]:
    return {**job(name, gpus=gpus), "selector": {"cluster": cluster}}


def test_a_cluster_added_at_run_time_is_stored_and_survives_a_restart(tmp_path: Path) -> None:
    cfg = config(str(tmp_path), clusters=[local("a")])
    service = started(cfg)
    source = service.add_cluster(local("b", region="eu"))
    views = {c.name: c for c in queries.list_clusters(service)}
    assert views["b"].inventory == source
    assert (views["a"].source, views["b"].source) == ("config", "api")
    assert views["b"].labels["gpuplane.io/region"] == "eu"
    assert views["b"].last_sync_at is not None
    assert views["b"].health == "ok"
    service.close()

    again = started(cfg)
    try:
        b = queries.get_cluster(again, "b")
        assert (b.source, b.gpus, b.settings["region"]) == ("api", 2, "eu")
        out = again.submit(on("b", "there", gpus=1))
        assert state(again, out["id"]).cluster_name == "b"
    finally:
        again.close()


def test_add_refuses_a_name_in_use_and_gpuplane_yaml_wins_a_clash(tmp_path: Path) -> None:
    service = started(config(str(tmp_path), clusters=[local("a")]))
    with pytest.raises(ConflictError, match=r"already exists \(declared in gpuplane\.yaml\)"):
        service.add_cluster(local("a"))
    service.add_cluster(local("b"))
    with pytest.raises(ConflictError, match="cluster b already exists"):
        service.add_cluster(local("b"))
    with pytest.raises(ConfigError, match="address carries a password"):
        service.add_cluster(
            ClusterConfig(name="r", adapter="ray", address="http://u:secret@127.0.0.1:1")
        )
    service.close()
    # b is declared in gpuplane.yaml too now (with 4 cards): the file's entry is the one used
    again = started(config(str(tmp_path), clusters=[local("a"), local("b", gpus=4)]))
    try:
        b = queries.get_cluster(again, "b")
        assert (b.source, b.gpus, b.settings) == ("config", 4, {})
    finally:
        again.close()


def test_a_backend_that_does_not_answer_is_refused_at_add_with_what_was_tried(
    two: ControlService,
) -> None:
    with pytest.raises(AdapterError, match=r"127\.0\.0\.1:9.*unreachable"):
        two.add_cluster(
            ClusterConfig(name="r", adapter="ray", address="http://127.0.0.1:9", sync_interval_s=1)
        )
    assert [c.name for c in queries.list_clusters(two)] == ["a", "b"]


def test_a_cordoned_cluster_takes_nothing_new_and_says_so(two: ControlService) -> None:
    two.cordon("a")
    first = two.submit(job("first", gpus=2))["id"]
    assert state(two, first).cluster_name == "b"
    second = two.submit(job("second", gpus=1))["id"]
    reasons = {r.cluster: (r.code, r.message) for r in queries.get_job(two, second).reasons}
    assert reasons["a"] == ("NoNodes", "the cluster is cordoned: nothing new is placed there")
    assert reasons["b"][0] == "InsufficientGpus"
    assert queries.get_cluster(two, "a").cordoned
    two.cordon("a", cordoned=False)
    assert wait_state(two, second, "running").cluster_name == "a"
    with pytest.raises(NotFoundError, match=r"unknown cluster 'bb' \(did you mean 'b'\?\)"):
        two.cordon("bb")


def test_drain_lets_jobs_finish_or_requeues_them_and_remove_waits_for_it(
    two: ControlService,
) -> None:
    two.cordon("a")
    running = two.submit(job("running", gpus=1))["id"]
    assert state(two, running).cluster_name == "b"
    two.cordon("a", cordoned=False)
    drained = two.drain("b")
    assert (drained.requeued, drained.running) == ([], [running])
    assert state(two, running).cluster_name == "b"  # it finishes there
    with pytest.raises(ConflictError, match=r"holds 1 job\(s\) \(running-.*cluster drain b"):
        two.remove_cluster("b")
    loose = two.submit(job("loose", gpus=1))["id"]
    assert state(two, loose).cluster_name == "a"

    drained = two.drain("b", requeue=True)  # its job is preempted, requeued, placed on a
    assert drained.requeued == [running]
    row = wait_state(two, running, "running")
    assert (row.cluster_name, row.attempts) == ("a", 1)
    two.tick()
    assert two.adapters["b"].workloads() == []
    two.remove_cluster("b")
    assert [c.name for c in queries.list_clusters(two)] == ["a"]
    with pytest.raises(ConflictError, match=r"declared in gpuplane\.yaml"):
        two.remove_cluster("a")


def test_an_unreachable_cluster_is_avoided_and_reconciled_when_it_returns(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    service = started(
        config(str(tmp_path), clusters=[local("flaky"), local("b")]),
        bind_on_submit=False,
        clock=lambda: now[0],
    )
    try:
        flaky = service.adapters["flaky"]
        assert isinstance(flaky, Flaky)
        running = service.submit(on("flaky", "running", gpus=1))["id"]
        service.tick()
        assert state(service, running).state == "running"
        # admitted on flaky; its bind went through there, but the store never heard of it
        service.cordon("b")
        unbound = service.submit(job("unbound", gpus=1))["id"]
        service.cordon("b", cordoned=False)
        assert (state(service, unbound).state, state(service, unbound).cluster_name) == (
            "admitted",
            "flaky",
        )
        with service.store.session() as session:
            row = session.get(Job, unbound)
            assert row is not None
            estate, _ = service.estate()
            flaky.bind(
                _workload(row, estate.snapshot.allocations[unbound], estate, service.vault.env_of)
            )

        flaky.why = "connection refused"
        service.tick()
        view = queries.get_job(service, running)
        assert view.state == "unknown"
        assert "cluster flaky does not answer (connection refused)" in str(view.message)
        assert [j.id for j in queries.list_jobs(service, state="unknown")] == [running]
        assert queries.get_cluster(service, "flaky").health == "unreachable"
        waiting = service.submit(on("flaky", "waiting", gpus=1))["id"]
        reasons = {r.cluster: r.message for r in queries.get_job(service, waiting).reasons}
        assert reasons["flaky"] == (
            "the cluster is unreachable (connection refused): nothing new is placed there"
        )
        moved = state(service, unbound)  # re-placed elsewhere, and bound there
        assert (moved.state, moved.cluster_name, moved.attempts) == ("running", "b", 1)
        new = service.submit(job("new", gpus=1))["id"]
        service.tick()
        assert state(service, new).cluster_name == "b"

        flaky.why = None
        service.tick()  # it is asked again once a sync interval (30 s)
        assert queries.get_cluster(service, "flaky").health == "unreachable"
        now[0] += 30
        service.tick()
        assert queries.get_cluster(service, "flaky").health == "ok"
        assert queries.get_job(service, running).state == "running"
        # the copy left on flaky is stopped; the job runs once, on b
        assert sorted(flaky.workloads()) == sorted([running, waiting])  # open again
        assert unbound in service.adapters["b"].workloads()
    finally:
        service.close()


def test_last_sync_moves_on_with_each_answer_once_a_sync_interval(tmp_path: Path) -> None:
    now = [1000.0]
    service = ControlService(config(str(tmp_path), clusters=[local("a")]), clock=lambda: now[0])
    service.start()
    try:
        assert queries.get_cluster(service, "a").last_sync_at == 1000.0
        now[0] += 10  # within the sync interval (30 s): not asked again
        service.tick()
        assert queries.get_cluster(service, "a").last_sync_at == 1000.0
        now[0] += 30
        service.tick()
        assert queries.get_cluster(service, "a").last_sync_at == 1040.0
    finally:
        service.close()


def test_a_stored_cluster_that_does_not_answer_at_start_is_registered_unreachable(
    tmp_path: Path,
) -> None:
    cfg = config(str(tmp_path), clusters=[local("a")])
    service = started(cfg)
    service.add_cluster(local("flaky"))
    service.close()

    def down_at_start(cluster: ClusterConfig, control: ControlConfig) -> ClusterAdapter:
        adapter = flaky_factory(cluster, control)
        if isinstance(adapter, Flaky):
            adapter.why = "connection refused"
        return adapter

    now = [1000.0]
    again = ControlService(cfg, clock=lambda: now[0])
    again.clusters.factory = down_at_start
    messages = again.start()  # the start goes on: the stored cluster may come back
    try:
        assert any("cluster flaky (local): unreachable" in m for m in messages)
        view = queries.get_cluster(again, "flaky")
        assert (view.health, view.source) == ("unreachable", "api")
        flaky = again.adapters["flaky"]
        assert isinstance(flaky, Flaky)
        flaky.why = None
        now[0] += 30
        again.tick()
        assert queries.get_cluster(again, "flaky").health == "ok"
    finally:
        again.close()


def test_clusters_added_or_removed_by_another_service_process_are_followed(
    tmp_path: Path,
) -> None:
    cfg = config(str(tmp_path), clusters=[local("a")])
    now = [1000.0]
    one = started(cfg.model_copy(update={"service_id": "one"}))
    two = ControlService(cfg.model_copy(update={"service_id": "two"}), clock=lambda: now[0])
    try:
        two.start()
        two.tick()
        one.add_cluster(local("b"))
        two.tick()  # within a sync interval (30 s) of its last look
        assert sorted(two.adapters) == ["a"]
        now[0] += 30
        two.tick()
        assert sorted(two.adapters) == ["a", "b"]
        one.remove_cluster("b")
        now[0] += 30
        two.tick()
        assert sorted(two.adapters) == ["a"]
    finally:
        one.close()
        two.close()
