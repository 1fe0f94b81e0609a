"""The local adapter: its inventory (declared, or found with nvidia-smi) and the device limits a
slice's process gets. What every adapter does alike (bind, status, exit codes, logs, release,
time limits, a command that cannot start) is the contract suite's,
`tests/control/adapters/test_contract.py`, which runs over every adapter."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.config import parse_settings
from gpuplane.control.adapters import (
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


@pytest.fixture
def adapter(tmp_path: Path) -> Iterator[ClusterAdapter]:
    # jobs run the test interpreter, which nobody (a root service's default job user) may not
    # reach; tests/control/test_job_privilege.py covers the switch
    control = ControlConfig(state_dir=str(tmp_path), kill_grace_s=2.0, allow_root_jobs=True)
    a = create_adapter(ClusterConfig(name="test", discover_gpus=False), control)
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


def test_unknown_adapter_kind_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unknown cluster adapter 'locall' \(did you mean 'local'\?\)"
    ):
        parse_settings({"control": {"clusters": [{"name": "x", "adapter": "locall"}]}})
