"""One contract suite over every cluster adapter: inventory, bind, observe, logs, cancel,
restart-and-reconcile, idempotent bind, a bind that fails half-way, time limits.

Each adapter runs against a real backend where one can run here: `local` on this machine, `ray`
on a real local Ray cluster of two nodes (`ray_cluster.py`, one per session, marked slow), and
`kubernetes` on the fake API server (`tests/control/k8s_fake`: no Kubernetes API server can run
on this machine; its kubelet runs each Pod's command here as a process). Every workload's command
therefore runs on this machine, so a test can see its processes and files.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuplane.control.adapters import (
    AdapterError,
    ClusterAdapter,
    Workload,
    WorkloadState,
    create_adapter,
)
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig, ControlConfig
from gpuplane.resources import LABEL_GPU_MODEL
from tests.control.k8s_fake import FakeKubeApi, hami_card
from tests.control.svc_helpers import wait_done


@dataclass
class Target:
    """An adapter kind under test: `make(service_id)` creates an adapter of that control-plane
    process (called twice with one: a restarted service); `node` has at least two cards."""

    kind: str
    node: str
    build: Callable[[str], ClusterAdapter]
    service_id: str = field(default_factory=lambda: f"contract-{uuid.uuid4().hex[:8]}")
    made: list[ClusterAdapter] = field(default_factory=list)

    def make(self, service_id: str | None = None) -> ClusterAdapter:
        adapter = self.build(service_id or self.service_id)
        self.made.append(adapter)
        return adapter


# "ray" asks for the session's Ray cluster by name (below), so it carries the Ray group itself
RAY = pytest.param("ray", marks=[pytest.mark.slow, pytest.mark.xdist_group("ray")])
KINDS = ["local", RAY, "kubernetes"]


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    fake: FakeKubeApi | None = None

    def control(service_id: str) -> ControlConfig:
        # local: its jobs write into tmp_path, which a root service's default job user
        # (nobody) may not reach; tests/control/test_job_privilege.py covers the switch
        return ControlConfig(
            state_dir=str(tmp_path), kill_grace_s=2.0, service_id=service_id, allow_root_jobs=True
        )

    if request.param == "local":

        def build(service_id: str) -> ClusterAdapter:
            cluster = ClusterConfig(name="test", discover_gpus=False)
            return create_adapter(cluster, control(service_id))

        t = Target("local", socket.gethostname() or "localhost", build)
    elif request.param == "ray":
        address = request.getfixturevalue("ray_address")

        def build(service_id: str) -> ClusterAdapter:
            cluster = ClusterConfig(name="test", adapter="ray", address=address)
            return create_adapter(cluster, control(service_id))

        t = Target("ray", "w1", build)
    else:
        fake = FakeKubeApi(minor=29, run_commands=True, bookmark_interval_s=0.2).start()
        fake.add_node("gpu-a", cards=[hami_card("GPU-a0", index=0), hami_card("GPU-a1", index=1)])
        kubeconfig = fake.kubeconfig(tmp_path / "kubeconfig")

        def build(service_id: str) -> ClusterAdapter:
            cluster = ClusterConfig(
                name="test",
                adapter="kubernetes",
                kubeconfig=kubeconfig,
                grace_period_s=1,
                sync_interval_s=2.0,
            )
            return create_adapter(cluster, control(service_id))

        t = Target("kubernetes", "gpu-a", build)
    yield t
    for adapter in t.made:
        adapter.close()  # stops every workload it holds
    if fake is not None:
        fake.stop()
        assert fake.kubelet.procs == {}, "a Pod's process outlived the test"


def slice_of(target: Target, job_id: str, command: tuple[str, ...], **kw: object) -> Workload:
    """A quarter of card 0 of the target's node, with 1 GiB of its memory."""
    return Workload(
        job_id,
        "contract",
        command,
        target.node,
        devices=(DeviceGrant(0, 1024, 250),),
        fractional=True,
        **kw,  # type: ignore[arg-type]
    )


def wait_lines(path: Path, n: int) -> list[str]:
    for _ in range(2400):
        if path.exists() and len(lines := path.read_text().splitlines()) >= n:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"{path} never had {n} line(s)")


def gone(pid: int) -> bool:
    for _ in range(600):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def sleeper(starts: Path) -> tuple[str, ...]:
    """Records each start (its pid, a line in `starts`), then sleeps."""
    return ("sh", "-c", f"echo $$ >> {starts}; exec sleep 60")


def test_inventory_lists_the_nodes_and_cards_in_gpuplanes_labels(target: Target) -> None:
    inv = target.make().inventory()
    assert inv.source
    node = next(n for n in inv.nodes if n.name == target.node)
    assert len(node.devices) >= 2
    assert all(d.mem_mib > 0 and d.model for d in node.devices)
    assert node.labels[LABEL_GPU_MODEL] == node.devices[0].model


def test_a_bound_workload_reports_its_exit_code_and_output(target: Target) -> None:
    adapter = target.make()
    code = "echo $GPUPLANE_JOB_ID $MY_VAR; echo a; echo b; echo c; exit 3"
    adapter.bind(slice_of(target, "exit3", ("sh", "-c", code), env={"MY_VAR": "x"}))
    assert "exit3" in adapter.workloads()
    assert wait_done(adapter, "exit3") == WorkloadState.FAILED
    status = adapter.status(["exit3"])["exit3"]
    assert status.exit_code == 3
    assert "code 3" in status.message
    assert b"".join(adapter.logs("exit3")) == b"exit3 x\na\nb\nc\n"
    assert b"".join(adapter.logs("exit3", tail=2)) == b"b\nc\n"
    assert b"".join(adapter.logs("exit3", since=8)) == b"a\nb\nc\n"


def test_a_workload_that_exits_0_succeeded(target: Target) -> None:
    adapter = target.make()
    adapter.bind(slice_of(target, "ok", ("sh", "-c", "echo done")))
    assert wait_done(adapter, "ok") == WorkloadState.SUCCEEDED
    assert adapter.status(["ok"])["ok"].exit_code == 0
    adapter.release("ok")
    assert "ok" not in adapter.workloads()
    assert adapter.status(["ok"])["ok"].state == WorkloadState.LOST


def test_the_output_outlives_the_workload(target: Target) -> None:
    """The service releases a workload once its end is recorded; `job logs` still answers."""
    adapter = target.make()
    adapter.bind(slice_of(target, "kept", ("sh", "-c", "echo done")))
    assert wait_done(adapter, "kept") == WorkloadState.SUCCEEDED
    adapter.release("kept")
    assert b"".join(adapter.logs("kept")) == b"done\n"
    assert b"".join(adapter.logs("kept", tail=1)) == b"done\n"


def test_a_second_bind_of_the_same_job_starts_it_once(target: Target, tmp_path: Path) -> None:
    adapter = target.make()
    starts = tmp_path / "starts"
    workload = slice_of(target, "twice", sleeper(starts))
    adapter.bind(workload)
    adapter.bind(workload)  # a retry after a lost answer: idempotent per job id
    (pid,) = wait_lines(starts, 1)
    adapter.bind(workload)
    time.sleep(1.0)  # a second start, had there been one, would have written its line by now
    assert starts.read_text().splitlines() == [pid]
    assert adapter.workloads() == ["twice"]
    assert adapter.status(["twice"])["twice"].state == WorkloadState.RUNNING


def test_release_stops_a_running_workload_and_is_idempotent(target: Target, tmp_path: Path) -> None:
    adapter = target.make()
    starts = tmp_path / "starts"
    adapter.bind(slice_of(target, "stopme", sleeper(starts)))
    (pid,) = wait_lines(starts, 1)
    adapter.release("stopme")
    assert gone(int(pid)), "the workload's process still runs after release"
    assert adapter.workloads() == []
    assert adapter.status(["stopme"])["stopme"].state == WorkloadState.LOST
    adapter.release("stopme")
    adapter.release("never-bound")


def test_a_restarted_service_takes_its_workloads_back(target: Target, tmp_path: Path) -> None:
    first = target.make()
    starts = tmp_path / "starts"
    running = slice_of(target, "adopted", sleeper(starts))
    first.bind(running)
    first.bind(slice_of(target, "ended", ("sh", "-c", "exit 4")))
    wait_lines(starts, 1)
    assert wait_done(first, "ended") == WorkloadState.FAILED
    again = target.make()  # the same instance, as after a restart
    assert sorted(again.workloads()) == ["adopted", "ended"]
    seen = again.status(["adopted", "ended"])
    assert seen["adopted"].state == WorkloadState.RUNNING
    assert (seen["ended"].state, seen["ended"].exit_code) == (WorkloadState.FAILED, 4)
    again.bind(running)  # the binder's retry of a job it had not recorded: taken back
    time.sleep(1.0)
    assert len(starts.read_text().splitlines()) == 1
    other = target.make("another-instance")
    assert other.workloads() == []  # never another service's strays
    again.release("adopted")
    again.release("ended")
    assert again.workloads() == []


def test_a_bind_that_fails_half_way_leaves_nothing_that_blocks_a_retry(target: Target) -> None:
    adapter = target.make()
    bad = slice_of(target, "half", ("no-such-binary-xyz",))
    if target.kind == "local":  # it starts the process itself, so it knows at once
        with pytest.raises(AdapterError, match="cannot start 'no-such-binary-xyz'"):
            adapter.bind(bad)
    else:  # the backend starts it on the node and learns only then that it cannot run
        adapter.bind(bad)
        assert wait_done(adapter, "half") == WorkloadState.FAILED
        assert adapter.status(["half"])["half"].exit_code not in (None, 0)
    adapter.release("half")
    adapter.bind(slice_of(target, "half", ("sh", "-c", "echo second try")))
    assert wait_done(adapter, "half") == WorkloadState.SUCCEEDED
    assert b"".join(adapter.logs("half")).endswith(b"second try\n")


def test_a_workload_past_its_time_limit_is_timed_out_until_released(
    target: Target, tmp_path: Path
) -> None:
    adapter = target.make()
    starts = tmp_path / "starts"
    adapter.bind(slice_of(target, "slow", sleeper(starts), time_limit_s=1.0))
    (pid,) = wait_lines(starts, 1)
    assert wait_done(adapter, "slow") == WorkloadState.TIMED_OUT
    assert "time limit" in adapter.status(["slow"])["slow"].message
    adapter.release("slow")  # what the service does once it recorded why the job ended
    assert gone(int(pid))
    assert adapter.workloads() == []
