"""The Ray runner on a real local Ray cluster of two nodes, started here and shut down after."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.batch.clips import list_clips
from gpuplane.batch.driver import Driver, RunOptions
from gpuplane.batch.errors import BatchError
from gpuplane.batch.journal import read_records
from gpuplane.batch.packing import CPU, Replica, declared_devices
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.runners.base import WorkerSpec, make_runner
from gpuplane.batch.runners.ray import GPU_MEM_RESOURCE, RayRunner, actor_options, endpoint
from tests.helpers.batch import TOY, expected, write_clips


def test_actor_options_map_slices_to_fractional_gpus_and_custom_resources() -> None:
    frac = actor_options(Replica("a", 0, "gpu0", 0.25, 8192), 1.0, custom=True)
    assert frac == {"num_cpus": 1.0, "num_gpus": 0.25, "resources": {GPU_MEM_RESOURCE: 8192}}
    whole = actor_options(Replica("a", 0, "gpu1", 1.0, 0), 2.0, custom=False)
    assert whole == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert actor_options(Replica("c", 0, CPU, 0.0, 0), 0.5, custom=True) == {"num_cpus": 0.5}


def test_ray_addresses_are_checked_at_their_gcs_or_client_port() -> None:
    assert endpoint("10.0.0.5") == ("10.0.0.5", 6379)
    assert endpoint("head:6380") == ("head", 6380)
    assert endpoint("ray://head") == ("head", 10001)
    assert endpoint("auto") is None  # Ray finds the cluster itself
    with pytest.raises(BatchError, match="write it as HOST:PORT"):
        endpoint("head:gcs")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    node: dict[str, Any] = {"num_cpus": 4, "num_gpus": 1, "resources": {GPU_MEM_RESOURCE: 81920}}
    with pytest.MonkeyPatch.context() as env:  # nothing of this machine's Ray setup reaches it
        env.setenv("HOME", str(tmp_path_factory.mktemp("ray-home")))
        env.setenv("RAY_AUTH_MODE", "disabled")
        for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.delenv(name, raising=False)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={**node, "include_dashboard": False, "object_store_memory": 80 << 20},
        )
        try:
            cluster.add_node(**node, object_store_memory=80 << 20)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            yield cluster.address
        finally:
            ray.shutdown()
            cluster.shutdown()


@pytest.mark.slow
def test_ray_runner_runs_the_plan_across_two_nodes(ray_cluster: str, tmp_path: Path) -> None:
    import ray

    clips = write_clips(tmp_path / "clips", 10)
    pipe = load_pipeline(TOY)
    spec = WorkerSpec(TOY, {}, str(tmp_path / "cache"))
    runner = make_runner("ray", address=ray_cluster)
    assert isinstance(runner, RayRunner)
    opts = RunOptions(
        out_dir=tmp_path / "run",
        devices=declared_devices(2),
        profile={"perception": 0.05, "size_check": 0.01, "sum_check": 0.01, "parity_check": 0.01},
        max_replicas=2,
    )
    summary = Driver(pipe, spec, runner, opts).run(list_clips(str(clips)))
    assert summary["status"] == "finished"
    got = {k: v["out"] for k, v in read_records(tmp_path / "run" / "results.jsonl").items()}
    assert got == expected(clips)
    # every replica became an actor; GPU actors got fractional cards on both nodes
    replicas = summary["plan"]["placements"]
    assert len(runner.idents) == len(replicas)
    gpu_idents = [
        runner.idents[(r["module"], r["replica"])] for r in replicas if r["device"] != CPU
    ]
    assert all(":gpu[" in i and not i.endswith("gpu[]") for i in gpu_idents)
    assert len({i.split(":")[0] for i in gpu_idents}) == 2
    assert summary["device_seconds"] > 0
    # a re-run with one stage-B version bumped serves perception from the cache
    bumped = load_pipeline(TOY, {"sum_check": "2"})
    spec2 = WorkerSpec(TOY, {"sum_check": "2"}, str(tmp_path / "cache"))
    again = Driver(
        bumped,
        spec2,
        make_runner("ray", address=ray_cluster),
        RunOptions(
            out_dir=tmp_path / "run2",
            devices=declared_devices(2),
            profile=opts.profile,
            max_replicas=2,
        ),
    ).run(list_clips(str(clips)))
    assert again["stages"]["perception"]["cached"] == 10
    assert again["stages"]["sum_check"]["computed"] == 10
    # the runners killed their actors: nothing of ours still holds a GPU
    deadline = time.monotonic() + 60  # ray.kill is asynchronous; wait for the release
    while ray.available_resources().get("GPU", 0) < 2.0 - 1e-9 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == pytest.approx(2.0)
