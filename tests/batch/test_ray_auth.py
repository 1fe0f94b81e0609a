"""The Ray runner and a cluster that requires a token (Ray's token authentication): what the
environment gets so that `ray.init` presents one, and `gpuplane batch run --runner ray` against
a real local token cluster, with the token and without it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.batch.errors import BatchError
from gpuplane.batch.runners.ray import auth_env
from tests.control.adapters.ray_cluster import RayCluster, RayNode, ray_cluster
from tests.helpers.batch import TOY, write_clips

TOKEN = secrets.token_hex(16)


def test_a_token_file_turns_token_mode_on_and_points_ray_at_it(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("s3cret\n")
    assert auth_env(str(token), {}) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def test_rays_own_token_variables_turn_token_mode_on_unless_a_mode_is_set() -> None:
    assert auth_env(None, {"RAY_AUTH_TOKEN": "x"}) == {"RAY_AUTH_MODE": "token"}
    assert auth_env(None, {"RAY_AUTH_TOKEN_PATH": "/f"}) == {"RAY_AUTH_MODE": "token"}
    assert auth_env(None, {"RAY_AUTH_TOKEN": "x", "RAY_AUTH_MODE": "disabled"}) == {}
    assert auth_env(None, {}) == {}


def test_an_unreadable_or_empty_token_file_is_refused_before_ray_aborts(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match=r"absent \(batch.ray_token_file\) cannot be read"):
        auth_env(str(tmp_path / "absent"), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(BatchError, match=r"empty \(batch.ray_token_file\) is empty"):
        auth_env(str(tmp_path / "empty"), {})


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    pytest.importorskip("ray")
    node = RayNode("solo", 1, 81920, {}, cpus=4)  # room for the toy plan's actors
    with ray_cluster([node], tmp_path_factory.mktemp("ray-auth"), token=TOKEN) as cluster:
        yield cluster


def batch_run(cluster: RayCluster, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`gpuplane batch run` of the toy pipeline on the cluster, with a HOME and environment that
    hold no token of their own."""
    clips = write_clips(tmp_path / "clips", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path / "home")
    args = [sys.executable, "-m", "gpuplane.cli.main", "batch", "run", TOY, "--clips", str(clips),
            "--out", str(tmp_path / "run"), "--cache", str(tmp_path / "cache"), "--runner", "ray",
            "--ray-address", cluster.gcs, "--gpus", "1", "--no-report", *extra]  # fmt: skip
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_the_runner_joins_a_token_cluster_with_its_token_file(
    token_cluster: RayCluster, tmp_path: Path
) -> None:
    token = tmp_path / "ray-token"
    token.write_text(TOKEN)
    res = batch_run(token_cluster, tmp_path, "--ray-token-file", str(token))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 done" in res.stdout


@pytest.mark.slow
def test_without_the_token_the_runner_names_the_settings(
    token_cluster: RayCluster, tmp_path: Path
) -> None:
    res = batch_run(token_cluster, tmp_path)
    text = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2, text
    assert f"could not join the Ray cluster at {token_cluster.gcs}" in text
    assert "batch.ray_token_file (--ray-token-file) or RAY_AUTH_TOKEN" in text
