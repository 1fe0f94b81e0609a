"""A job's env from a team's secret (`secretRef`) or the service's environment (`fromEnv`): the
job gets the value; the store, the job's record and `describe` never hold it in clear."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.identity.auth import Role
from gpuplane.control.identity.config import AuthConfig
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import TeamConfig
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import api_client, config, job, make_service, wait_state

VALUE = "s3cr3t-value-7f2e"
PRINT = ["sh", "-c", 'printf "%s" "$API_KEY"']


@pytest.fixture
def svc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlService]:
    monkeypatch.setenv("GP_TEST_SHARED", "from-the-service")
    monkeypatch.setenv("GP_TEST_PRIVATE", "never-passed")
    cfg = config(str(tmp_path), teams=(TeamConfig(name="research"), TeamConfig(name="vision")))
    cfg = cfg.model_copy(update={"auth": AuthConfig(from_env=["GP_TEST_SHARED"])})
    service = make_service(cfg)
    yield service
    service.close()


@pytest.fixture
def client(svc: ControlService) -> Iterator[TestClient]:
    _, member = svc.tokens.create("m", Role.member, "research")
    with api_client(svc, member) as c:
        yield c


def _logs(client: TestClient, svc: ControlService, job_id: str) -> str:
    wait_state(svc, job_id, "succeeded", "failed")
    return client.get(f"/jobs/{job_id}/logs").text


def test_a_job_gets_its_teams_secret_which_is_never_stored_or_shown_in_clear(
    client: TestClient, svc: ControlService
) -> None:
    assert client.put("/teams/research/secrets/api-key", json={"value": VALUE}).status_code == 200
    listed = client.get("/teams/research/secrets").json()
    assert [s["name"] for s in listed] == ["api-key"]
    assert VALUE not in str(listed)
    spec = job("uses-secret", command=PRINT) | {"env": {"API_KEY": {"secretRef": "api-key"}}}
    made = client.post("/jobs", json=spec).json()
    assert made["env"] == {"API_KEY": {"secretRef": "api-key"}}
    assert _logs(client, svc, made["id"]) == VALUE
    assert VALUE not in client.get(f"/jobs/{made['id']}").text
    db = Path(svc.config.state_dir)
    assert all(VALUE.encode() not in p.read_bytes() for p in db.glob("control.db*"))


def test_a_spec_naming_a_secret_its_team_lacks_is_refused_at_submit(client: TestClient) -> None:
    spec = job("nope", command=PRINT) | {"env": {"API_KEY": {"secretRef": "missing"}}}
    r = client.post("/jobs", json=spec)
    assert r.status_code == 422
    assert "team research has no secret missing" in r.json()["detail"]
    assert "gpuplane secret set missing --team research" in r.json()["detail"]


def test_another_teams_secrets_answer_404(svc: ControlService, client: TestClient) -> None:
    svc.vault.set("vision", "theirs", VALUE)
    assert client.get("/teams/vision/secrets").status_code == 404
    assert client.put("/teams/vision/secrets/x", json={"value": "v"}).status_code == 404
    assert client.delete("/teams/vision/secrets/theirs").status_code == 404
    assert [s.name for s in svc.vault.list("vision")] == ["theirs"]
    # a spec of research cannot name vision's secret either: it is looked up in its own team
    spec = job("steal", command=PRINT) | {"env": {"API_KEY": {"secretRef": "theirs"}}}
    assert client.post("/jobs", json=spec).status_code == 422


def test_from_env_passes_only_the_variables_the_config_allows(
    client: TestClient, svc: ControlService
) -> None:
    spec = job("shared", command=PRINT) | {"env": {"API_KEY": {"fromEnv": "GP_TEST_SHARED"}}}
    made = client.post("/jobs", json=spec).json()
    assert _logs(client, svc, made["id"]) == "from-the-service"
    refused = job("private", command=PRINT) | {"env": {"API_KEY": {"fromEnv": "GP_TEST_PRIVATE"}}}
    r = client.post("/jobs", json=refused)
    assert r.status_code == 422
    assert "control.auth.from_env: GP_TEST_SHARED" in r.json()["detail"]


def test_a_secret_deleted_before_its_job_starts_fails_the_job_saying_so(
    tmp_path: Path,
) -> None:
    svc = make_service(config(str(tmp_path)))
    try:
        svc.intake.bind_on_submit = False
        svc.vault.set("research", "k", VALUE)
        spec = job("late", command=PRINT) | {"env": {"API_KEY": {"secretRef": "k"}}}
        job_id = svc.submit(spec)["id"]
        svc.vault.delete("research", "k")
        row = wait_state(svc, job_id, "failed", "succeeded")
        assert row.state == "failed"
        assert "no secret 'k'" in (row.message or "")
    finally:
        svc.close()


def test_the_secret_cli_sets_from_a_prompt_and_lists_names_only(svc: ControlService) -> None:
    with serving(svc) as url:
        code, out = cli(url, "secret", "set", "db-pass", "--team", "research", input=VALUE + "\n")
        assert code == 0, out
        code, out = cli(url, "secret", "list", "--team", "research")
        assert code == 0
        assert "db-pass" in out
        assert VALUE not in out
        code, out = cli(url, "secret", "delete", "db-pass", "--team", "research")
        assert code == 0, out
        code, out = cli(url, "secret", "delete", "db-pass", "--team", "research")
        assert code == 1
        assert "has no secret 'db-pass'" in out
