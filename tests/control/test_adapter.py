"""Cluster adapters with real workloads: one contract suite for every adapter that can run on
this machine (bind, status, logs, exit codes, release), plus the local adapter's inventory."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.config import parse_settings
from gpuplane.control.adapters import (
    AdapterError,
    ClusterAdapter,
    Workload,
    WorkloadState,
    create_adapter,
)
from gpuplane.control.adapters.local import parse_nvidia_smi
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig, ControlConfig, DeclaredGpus, DeclaredNode
from gpuplane.errors import ConfigError
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION
from tests.control.svc_helpers import wait_done

# Kubernetes and Ray adapters join this list when they land (each with its own test backend).
KINDS = ["local"]


@pytest.fixture(params=KINDS)
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterAdapter]:
    # jobs run the test interpreter, which nobody (a root service's default job user) may not
    # reach; tests/control/test_job_privilege.py covers the switch
    control = ControlConfig(state_dir=str(tmp_path), kill_grace_s=2.0, allow_root_jobs=True)
    a = create_adapter(
        ClusterConfig(name="test", adapter=request.param, discover_gpus=False), control
    )
    yield a
    a.close()  # stops every workload (`no_job_outlives_the_test` checks)


def test_without_a_gpu_the_default_inventory_is_two_declared_80gib_cards(tmp_path: Path) -> None:
    cluster = ClusterConfig(name="local", discover_gpus=False)
    inv = create_adapter(cluster, ControlConfig(state_dir=str(tmp_path))).inventory()
    assert len(inv.nodes) == 1
    node = inv.nodes[0]
    assert [(d.index, d.mem_mib) for d in node.devices] == [(0, 81920), (1, 81920)]
    assert node.labels[LABEL_GPU_MODEL] == "A100-80GB"
    assert "no GPU found" in inv.source
    assert "declared 2" in inv.source


def test_declared_nodes_come_from_config(tmp_path: Path) -> None:
    cluster = ClusterConfig(
        name="lab",
        region="eu-west",
        discover_gpus=False,
        nodes=[
            DeclaredNode(
                name="n1",
                labels={"rack": "r1"},
                gpus=[DeclaredGpus(model="L4", mem_mib=24576, count=4)],
            )
        ],
    )
    inv = create_adapter(cluster, ControlConfig(state_dir=str(tmp_path))).inventory()
    (node,) = inv.nodes
    assert node.name == "n1"
    assert len(node.devices) == 4
    assert node.labels[LABEL_GPU_MODEL] == "L4"
    assert node.labels[LABEL_REGION] == "eu-west"
    assert node.labels["rack"] == "r1"
    assert "declared in config" in inv.source


def test_parse_nvidia_smi() -> None:
    text = "0, NVIDIA H200, 143771, GPU-aaa\n1, NVIDIA H200, 143771, GPU-bbb\n"
    devices = parse_nvidia_smi(text)
    assert [(d.index, d.model, d.mem_mib, d.uuid) for d in devices] == [
        (0, "H200", 143771, "GPU-aaa"),
        (1, "H200", 143771, "GPU-bbb"),
    ]
    assert parse_nvidia_smi("No devices were found\n") == []


def test_a_slice_gets_cuda_visible_devices_and_hami_limits(adapter: ClusterAdapter) -> None:
    code = (
        "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith(('CUDA_', 'GPUPLANE_', 'MY_'))}))"
    )
    adapter.bind(
        Workload(
            job_id="j1",
            name="envcheck",
            command=(sys.executable, "-c", code),
            node="n",
            devices=(DeviceGrant(1, 10240, 250),),
            env={"MY_VAR": "x"},
            fractional=True,
        )
    )
    assert wait_done(adapter, "j1") == WorkloadState.SUCCEEDED
    env = json.loads(b"".join(adapter.logs("j1")))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "10240m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert env["GPUPLANE_JOB_ID"] == "j1"
    assert env["MY_VAR"] == "x"
    adapter.release("j1")


def test_whole_cards_get_no_slice_limits(adapter: ClusterAdapter) -> None:
    code = (
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], 'CUDA_DEVICE_SM_LIMIT' in os.environ)"
    )
    adapter.bind(
        Workload(
            job_id="j2",
            name="whole",
            command=(sys.executable, "-c", code),
            node="n",
            devices=(DeviceGrant(0, 81920, 1000), DeviceGrant(1, 81920, 1000)),
        )
    )
    wait_done(adapter, "j2")
    assert b"".join(adapter.logs("j2")).strip() == b"0,1 False"
    adapter.release("j2")


def test_exit_code_and_log_tail(adapter: ClusterAdapter) -> None:
    code = "import sys; print('a'); print('b'); print('c'); sys.exit(3)"
    adapter.bind(Workload("j3", "fails", (sys.executable, "-c", code), "n"))
    assert wait_done(adapter, "j3") == WorkloadState.FAILED
    status = adapter.status(["j3"])["j3"]
    assert status.exit_code == 3
    assert "code 3" in status.message
    assert b"".join(adapter.logs("j3", tail=2)) == b"b\nc\n"
    adapter.release("j3")
    assert adapter.status(["j3"])["j3"].state == WorkloadState.LOST
    assert b"".join(adapter.logs("j3", tail=1)) == b"c\n"  # logs outlive the process


def test_release_stops_a_running_workload_and_is_idempotent(
    adapter: ClusterAdapter, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    command = ("sh", "-c", f"echo $$ > {pidfile}; exec sleep 60")
    adapter.bind(Workload("j4", "sleeper", command, "n"))
    adapter.bind(Workload("j4", "sleeper", ("ignored",), "n"))  # idempotent per job id
    assert adapter.status(["j4"])["j4"].state == WorkloadState.RUNNING
    assert adapter.workloads() == ["j4"]
    for _ in range(2400):  # the workload has started once it wrote its pid
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    adapter.release("j4")
    assert adapter.workloads() == []
    assert adapter.status(["j4"])["j4"].state == WorkloadState.LOST
    if adapter.kind == "local":
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    adapter.release("j4")
    adapter.release("never-bound")


def test_a_workload_past_its_time_limit_is_reported_timed_out_until_released(
    adapter: ClusterAdapter, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    command = ("sh", "-c", f"echo $$ > {pidfile}; exec sleep 30")
    adapter.bind(Workload("j6", "sleeper", command, "n", time_limit_s=1.0))
    assert wait_done(adapter, "j6") == WorkloadState.TIMED_OUT
    assert "exceeded its time limit" in adapter.status(["j6"])["j6"].message
    for _ in range(2400):  # the workload has started once it wrote its pid
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    adapter.release("j6")  # what the service does once it recorded why the job ended
    assert adapter.workloads() == []
    if adapter.kind == "local":
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_missing_command_is_refused_with_the_reason(adapter: ClusterAdapter) -> None:
    with pytest.raises(AdapterError, match="cannot start 'no-such-binary-xyz'"):
        adapter.bind(Workload("j5", "bad", ("no-such-binary-xyz",), "n"))


def test_unknown_adapter_kind_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unknown cluster adapter 'locall' \(did you mean 'local'\?\)"
    ):
        parse_settings({"control": {"clusters": [{"name": "x", "adapter": "locall"}]}})
