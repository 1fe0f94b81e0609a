"""A job must name a declared team: an undeclared one is refused (404, the declared teams, the
nearest name), never created on the fly with no quota; `control.default_team` takes jobs that
name none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from pydantic import ValidationError

from gpuplane.control.settings import ControlConfig, QuotaConfig, TeamConfig
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import A100, api_client, config, job, make_service

LIMITED = [
    TeamConfig(name="research", quotas=[QuotaConfig(flavor=A100, gpus=1)]),
    TeamConfig(name="vision", quotas=[QuotaConfig(flavor=A100, gpus=1)]),
]


def client_for(tmp_path: Path, **settings: object) -> Iterator[TestClient]:
    cfg = config(str(tmp_path), teams=LIMITED).model_copy(update=settings)
    svc = make_service(cfg)
    try:
        with api_client(svc) as c:
            yield c
    finally:
        svc.close()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_for(tmp_path)


@pytest.fixture
def default_client(tmp_path: Path) -> Iterator[TestClient]:
    yield from client_for(tmp_path, default_team="vision")


def team_names(client: TestClient) -> list[str]:
    return [t["name"] for t in client.get("/teams").json()]


def test_an_undeclared_team_cannot_take_the_gpus_its_quota_would_deny(client: TestClient) -> None:
    r = client.post("/jobs", json=job("grab", team="anyone", gpus=2))
    assert r.status_code == 404
    assert "unknown team 'anyone'" in r.json()["detail"]
    assert "valid: research, vision" in r.json()["detail"]
    assert "gpuplane quota set anyone" in r.json()["detail"]
    assert team_names(client) == ["research", "vision"]
    assert client.get("/jobs").json() == []
    assert client.put("/teams/anyone", json={"weight": 1}).status_code == 200  # declared now
    r = client.post("/jobs", json=job("grab", team="anyone", gpus=1))
    assert r.status_code == 201
    assert r.json()["team"] == "anyone"
    anonymous = job("anon", gpus=1)
    del anonymous["team"]
    r = client.post("/jobs", json=anonymous)
    assert r.status_code == 422  # no default_team: a spec names its team
    assert "team: Field required" in r.json()["detail"]


def test_a_misspelt_team_gets_the_nearest_declared_one(client: TestClient) -> None:
    r = client.post("/jobs", json=job("typo", team="reserch", gpus=1))
    assert r.status_code == 404
    assert "did you mean 'research'?" in r.json()["detail"]
    dry = client.post("/jobs", json=job("typo", team="reserch", gpus=1), params={"dry_run": True})
    assert dry.status_code == 404  # a dry run answers what the submit would
    assert "did you mean 'research'?" in dry.json()["detail"]


def test_a_batch_with_one_undeclared_team_queues_nothing(client: TestClient) -> None:
    r = client.post("/jobs/batch", json=[job("a", gpus=1), job("b", team="nobody", gpus=1)])
    assert r.status_code == 404
    assert "unknown team 'nobody'" in r.json()["detail"]
    assert client.get("/jobs").json() == []


def test_the_default_team_takes_a_job_that_names_none(default_client: TestClient) -> None:
    spec = job("anon", gpus=1)
    del spec["team"]
    r = default_client.post("/jobs", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["team"] == "vision"
    again = default_client.post("/jobs", json={**spec, "name": "anon2"}).json()
    assert again["state"] == "pending"  # vision's quota of 1 GPU holds
    assert again["reasons"][0]["code"] == "Quota"
    r = default_client.post("/jobs", json=job("stray", team="elsewhere", gpus=1))
    assert r.status_code == 404  # naming an undeclared team is refused all the same
    assert "elsewhere" not in team_names(default_client)


def test_the_default_team_must_be_declared() -> None:
    with pytest.raises(ValidationError, match="default_team: unknown team 'visoin'"):
        ControlConfig(teams=LIMITED, default_team="visoin")
    with pytest.raises(ValidationError, match="did you mean 'vision'"):
        ControlConfig(teams=LIMITED, default_team="visoin")


def test_the_cli_says_which_teams_exist_and_exits_non_zero(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job("typo", team="visoin", gpus=1)))
    svc = make_service(config(str(tmp_path), teams=LIMITED))
    try:
        with serving(svc) as url:
            code, out = cli(url, "job", "submit", str(spec))
    finally:
        svc.close()
    assert code == 1
    assert "HTTP 404" in out
    assert "unknown team 'visoin' (did you mean 'vision'?); valid: research, vision" in out


# -- what the config file sets and what the API sets ---------------------------------------------


def client_for_teams(tmp_path: Path, teams: list[TeamConfig]) -> Iterator[TestClient]:
    svc = make_service(config(str(tmp_path), teams=teams))
    try:
        with api_client(svc) as c:
            yield c
    finally:
        svc.close()


def quota_of(client: TestClient, team: str) -> list[tuple[str, float]]:
    return [(q["flavor"], q["gpus"]) for q in client.get(f"/teams/{team}").json()["quotas"]]


def test_what_the_api_sets_survives_a_restart_where_the_config_states_nothing(
    tmp_path: Path,
) -> None:
    teams = [TeamConfig(name="research")]  # declared, its cohort, weight and quotas left out
    for client in client_for_teams(tmp_path, teams):
        assert client.put(f"/teams/research/quotas/{A100}", json={"gpus": 1.5}).status_code == 200
        assert client.put("/teams/research", json={"cohort": "ml", "weight": 3}).status_code == 200
    for client in client_for_teams(tmp_path, teams):
        assert quota_of(client, "research") == [(A100, 1.5)]
        team = client.get("/teams/research").json()
        assert (team["cohort"], team["weight"]) == ("ml", 3.0)


def test_what_the_config_states_is_refused_through_the_api_and_applied_at_start(
    tmp_path: Path,
) -> None:
    teams = [TeamConfig(name="research", weight=2, quotas=[QuotaConfig(flavor=A100, gpus=1)])]
    for client in client_for_teams(tmp_path, teams):
        r = client.put(f"/teams/research/quotas/{A100}", json={"gpus": 2})
        assert r.status_code == 409
        assert "the config file sets team research's quotas (control.teams)" in r.json()["detail"]
        assert "leave quotas out of the team's entry" in r.json()["detail"]
        r = client.put("/teams/research", json={"weight": 5})
        assert r.status_code == 409
        assert "sets team research's weight" in r.json()["detail"]
        # what the file does not state is the API's; a PUT that changes nothing it states passes
        assert client.put("/teams/research", json={"cohort": "ml", "weight": 2}).status_code == 200
        assert client.put(f"/teams/research/quotas/{A100}", json={"gpus": 1}).status_code == 200
        assert quota_of(client, "research") == [(A100, 1.0)]
    edited = [TeamConfig(name="research", weight=2, quotas=[QuotaConfig(flavor=A100, gpus=3)])]
    for client in client_for_teams(tmp_path, edited):
        assert quota_of(client, "research") == [(A100, 3.0)]  # the file's edit, at start
        assert client.get("/teams/research").json()["cohort"] == "ml"  # the API's, kept
