"""The ray adapter against a real local Ray cluster that requires a token (Ray's token
authentication, `RAY_AUTH_MODE=token`): it takes the token from the cluster's `token_file` or the
environment, runs a job with it, and says what to set when the token is missing or wrong. The
contract suite runs the same adapter against a cluster without authentication."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.adapters import AdapterError, Workload, WorkloadState, create_adapter
from gpuplane.control.adapters.ray import RayAdapter
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig, ControlConfig
from tests.control.adapters.ray_cluster import RayNode, ray_cluster
from tests.control.svc_helpers import wait_done

pytestmark = pytest.mark.slow
TOKEN = secrets.token_hex(16)


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The job API URL of a one-node Ray cluster that requires TOKEN."""
    node = RayNode("solo", 1, 24576, {"gpuplane.io/gpu-model": "L4"})
    with ray_cluster([node], tmp_path_factory.mktemp("ray-auth"), token=TOKEN) as cluster:
        yield cluster.url


@pytest.fixture(autouse=True)
def no_ambient_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing of this machine's Ray setup reaches the adapter: only what each test gives."""
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def adapter(tmp_path: Path, address: str, token_file: Path | None = None) -> RayAdapter:
    cluster = ClusterConfig(
        name="lab", adapter="ray", address=address, token_file=str(token_file or "") or None
    )
    config = ControlConfig(state_dir=str(tmp_path / "state"), service_id="i", allow_root_jobs=True)
    made = create_adapter(cluster, config)
    assert isinstance(made, RayAdapter)
    return made


def test_the_token_from_token_file_lists_the_nodes_and_runs_a_job(
    token_cluster: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "ray-token"
    token_file.write_text(TOKEN + "\n")
    ray = adapter(tmp_path, token_cluster, token_file)
    try:
        assert [n.name for n in ray.inventory().nodes] == ["solo"]
        grant = (DeviceGrant(0, 1024, 250),)
        work = Workload("authed", "t", ("sh", "-c", "echo hi"), "solo", devices=grant)
        ray.bind(work)
        assert wait_done(ray, "authed") == WorkloadState.SUCCEEDED
        assert b"".join(ray.logs("authed")) == b"hi\n"
    finally:
        ray.close()


def test_the_token_from_the_environment_is_taken_too(
    token_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    assert [n.name for n in adapter(tmp_path, token_cluster).inventory().nodes] == ["solo"]


def test_a_missing_token_says_which_setting_to_give(token_cluster: str, tmp_path: Path) -> None:
    says = r"lab .* requires a token .*`token_file`.*RAY_AUTH_TOKEN"
    with pytest.raises(AdapterError, match=says):
        adapter(tmp_path, token_cluster).inventory()


def test_a_wrong_token_is_refused_naming_where_it_came_from(
    token_cluster: str, tmp_path: Path
) -> None:
    home_token = tmp_path / "home" / ".ray" / "auth_token"  # another cluster's, left behind
    home_token.parent.mkdir(parents=True)
    home_token.write_text("not-this-clusters-token")
    says = r"refused the token from Ray's default file .*auth_token"
    with pytest.raises(AdapterError, match=says):
        adapter(tmp_path, token_cluster).inventory()


def test_a_token_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match=r"token file .*absent \(token_file\) cannot be read"):
        adapter(tmp_path, "http://127.0.0.1:9", tmp_path / "absent")
