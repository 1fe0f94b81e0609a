"""The ray adapter's translations without a cluster: its node rows to inventory, a workload to
Ray's job-submission body, Ray's job details to workload states, its logs without Ray's own
lines, and the refusals (no address, an address nothing answers at). The rows and bodies are
Ray 2.60's wire format, as its dashboard answered on this machine (the contract suite runs the
adapter on a real local cluster)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuplane.config import parse_settings
from gpuplane.control.adapters import AdapterError, Workload, WorkloadState, create_adapter
from gpuplane.control.adapters.ray import RayAdapter
from gpuplane.control.adapters.ray_jobs import job_status, own_output, ray_request
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig, ControlConfig
from gpuplane.errors import ConfigError
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION, LABEL_VGPU

WORKER = {
    "node_id": "c0664732655561",
    "state": "ALIVE",
    "resources_total": {
        "GPU": 4.0,
        "gpu_mem_mib": 98304.0,
        "CPU": 8.0,
        "memory": 32 * 1024**3,
        "accelerator_type:L4": 1.0,
    },
    "labels": {"ray.io/node-id": "c0664732655561", "gpuplane.io/node": "w1", "rack": "r2"},
}
UNLABELLED = {
    "node_id": "d40c3064ae1c4c",
    "state": "ALIVE",
    "resources_total": {"GPU": 2.0, "CPU": 1.0},
    "labels": {"ray.io/node-id": "d40c3064ae1c4c"},
}


def adapter(tmp_path: Path, address: str = "http://127.0.0.1:8265") -> RayAdapter:
    cluster = ClusterConfig(name="r", adapter="ray", address=address, region="eu-west")
    made = create_adapter(cluster, ControlConfig(state_dir=str(tmp_path), service_id="i"))
    assert isinstance(made, RayAdapter)
    return made


def test_a_node_row_becomes_a_node_with_its_cards_in_gpuplanes_labels(tmp_path: Path) -> None:
    node, selector, has_mem = adapter(tmp_path)._node(WORKER)
    assert node.name == "w1"
    assert [(d.index, d.model, d.mem_mib) for d in node.devices] == [
        (i, "L4", 24576) for i in range(4)
    ]
    assert (node.cpu_millis, node.memory_mib) == (8000, 32 * 1024)
    assert node.labels[LABEL_GPU_MODEL] == "L4"
    assert node.labels[LABEL_REGION] == "eu-west"
    assert node.labels[LABEL_VGPU] == "true"
    assert node.labels["rack"] == "r2"
    assert "ray.io/node-id" not in node.labels
    assert (selector, has_mem) == ({"gpuplane.io/node": "w1"}, True)


def test_a_node_without_labels_or_gpu_memory_gets_its_id_and_the_defaults(tmp_path: Path) -> None:
    node, selector, has_mem = adapter(tmp_path)._node(UNLABELLED)
    assert node.name == "d40c3064ae1c4c"
    assert selector == {"ray.io/node-id": "d40c3064ae1c4c"}
    assert not has_mem
    assert [(d.model, d.mem_mib) for d in node.devices] == [("A100-80GB", 81920)] * 2


def test_a_slice_asks_ray_for_its_share_of_a_card_and_its_memory_on_its_node() -> None:
    workload = Workload(
        "j1",
        "train",
        ("python", "train.py", "--lr", "1e-3 x"),
        "w1",
        devices=(DeviceGrant(1, 10240, 250),),
        env={"MY": "v"},
        workdir="/data/run 1",
        cpu_millis=500,
        memory_mib=2048,
        fractional=True,
        time_limit_s=60.0,
    )
    body = ray_request(workload, {"gpuplane.io/node": "w1"}, has_gpu_mem=True)
    assert body["submission_id"] == "j1"
    assert body["entrypoint"] == "cd '/data/run 1' && python train.py --lr '1e-3 x'"
    assert body["entrypoint_num_gpus"] == 0.25
    assert body["entrypoint_resources"] == {"gpu_mem_mib": 10240.0}
    assert body["entrypoint_num_cpus"] == 0.5
    assert body["entrypoint_memory"] == 2048 * 1024 * 1024
    assert body["entrypoint_label_selector"] == {"gpuplane.io/node": "w1"}
    env = body["runtime_env"]["env_vars"]
    assert env["MY"] == "v"
    assert env["GPUPLANE_JOB_ID"] == "j1"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "10240m"
    assert "CUDA_VISIBLE_DEVICES" not in env  # Ray sets it for the card it picks
    assert body["metadata"]["gpuplane.io/time-limit-s"] == "60.0"


def test_whole_cards_ask_for_that_many_gpus_and_no_memory_a_node_does_not_declare() -> None:
    grants = (DeviceGrant(0, 81920, 1000), DeviceGrant(1, 81920, 1000))
    body = ray_request(Workload("j2", "w", ("true",), "n", devices=grants), {}, has_gpu_mem=False)
    assert body["entrypoint_num_gpus"] == 2.0
    assert "entrypoint_resources" not in body  # it would never be scheduled there


def test_rays_job_states_become_workload_states() -> None:
    running = {"status": "RUNNING", "start_time": 1000_000, "metadata": {}}
    assert job_status(running, 2000.0).state == WorkloadState.RUNNING
    assert job_status({"status": "PENDING"}, 0).state == WorkloadState.RUNNING
    limited = {**running, "metadata": {"gpuplane.io/time-limit-s": "60.0"}}
    assert job_status(limited, 1059.0).state == WorkloadState.RUNNING
    late = job_status(limited, 1060.0)
    assert late.state == WorkloadState.TIMED_OUT
    assert "1m" in late.message
    ok = job_status({"status": "SUCCEEDED", "driver_exit_code": 0}, 0)
    assert (ok.state, ok.exit_code) == (WorkloadState.SUCCEEDED, 0)
    failed = {
        "status": "FAILED",
        "driver_exit_code": 127,
        "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
        "message": "Job entrypoint command failed with exit code 127, last logs:\nsh: x: not found",
    }
    got = job_status(failed, 0)
    assert (got.state, got.exit_code) == (WorkloadState.FAILED, 127)
    assert "exited with code 127" in got.message
    assert "not found" in got.message
    died = {"status": "FAILED", "error_type": "JOB_SUPERVISOR_ACTOR_DIED", "message": "died\n.."}
    assert "Ray failed it (JOB_SUPERVISOR_ACTOR_DIED): died" in job_status(died, 0).message
    stopped = job_status({"status": "STOPPED"}, 0)
    assert stopped.state == WorkloadState.FAILED
    assert "outside gpuplane" in stopped.message


def test_the_logs_leave_out_the_lines_ray_writes_into_them() -> None:
    logs = (
        "2026-12-01 22:33:56,690\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
        "first\n"
        "Running entrypoint for job j1: sh -c 'echo first'\n"
        "Running entrypoint for job other: kept, it is not this job's line\n"
    )
    assert own_output("j1", logs) == (
        b"first\nRunning entrypoint for job other: kept, it is not this job's line\n"
    )


def test_a_ray_cluster_without_an_address_is_refused_saying_what_to_give() -> None:
    with pytest.raises(ConfigError, match="a ray cluster needs `address`"):
        parse_settings({"control": {"clusters": [{"name": "r", "adapter": "ray"}]}})


def test_an_address_nothing_answers_at_is_an_adapter_error_naming_it(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    a = adapter(tmp_path, f"http://127.0.0.1:{port}")
    with pytest.raises(
        AdapterError, match=rf"ray cluster r at http://127.0.0.1:{port}.*unreachable"
    ):
        a.inventory()
    with pytest.raises(AdapterError, match="could not list its jobs"):
        a.workloads()
    a.release("j1")  # never raises
    a.close()
