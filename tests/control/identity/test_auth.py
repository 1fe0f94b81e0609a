"""Identity and authorization of the control API: the policy table row by row over every route,
and the attacks of issue 23 (anonymous mutation, cross-team cancel, cross-site form, a bad Host,
a member changing quotas) as regressions."""

from __future__ import annotations

import itertools
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import select

from gpuplane.control.api.app import _endpoints
from gpuplane.control.identity.auth import POLICY, Role
from gpuplane.control.identity.config import AuthConfig, OidcConfig
from gpuplane.control.identity.tokens import TokenBook
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import (
    ClusterConfig,
    ControlConfig,
    DeclaredGpus,
    DeclaredNode,
    TeamConfig,
)
from gpuplane.control.store.models import ApiToken, Job
from gpuplane.plane import control_app
from tests.console.console_helpers import batch_run, console_client
from tests.control.svc_helpers import (
    A100,
    admin_token,
    api_client,
    config,
    job,
    make_service,
    state,
)

TEAMS = (TeamConfig(name="research"), TeamConfig(name="vision"))
DEPLOYMENT = {
    "name": "chat",
    "model": "sim",
    "version": "v1",
    "engine": "sim",
    "replicas": 1,
    "team": "research",
    "slice": {"gpu_mem_mib": 8192, "gpu_cores_pct": 25},
    "canary": [{"version": "v2", "weight": 10}],
}


def _cluster(name: str) -> dict[str, Any]:
    """A local cluster of one declared card, as `POST /clusters` takes one."""
    node = DeclaredNode(name=f"{name}-n1", gpus=[DeclaredGpus(model=A100, mem_mib=81920, count=1)])
    cluster = ClusterConfig(name=name, discover_gpus=False, nodes=[node])
    return cluster.model_dump(mode="json")


@dataclass
class World:
    """A service with a running job of team research, and a token of each kind."""

    svc: ControlService
    http: TestClient
    tokens: dict[str, str]  # viewer, member, admin (research); other (a member of vision)
    job_id: str
    token_id: str

    def call(self, method: str, url: str, body: Any = None, as_: str | None = None) -> Any:
        headers = {"authorization": f"Bearer {self.tokens[as_]}"} if as_ else {}
        return self.http.request(method, url, json=body, headers=headers)

    def calls(self) -> dict[tuple[str, str], tuple[str, Any]]:
        """One concrete request for every route of the app: its URL and body."""
        j = self.job_id
        return {
            ("GET", "/healthz"): ("/healthz", None),
            ("GET", "/openapi.json"): ("/openapi.json", None),
            ("GET", "/docs"): ("/docs", None),
            ("GET", "/docs/oauth2-redirect"): ("/docs/oauth2-redirect", None),
            ("GET", "/redoc"): ("/redoc", None),
            ("GET", "/metrics"): ("/metrics", None),
            ("GET", "/clusters"): ("/clusters", None),
            ("GET", "/clusters/{name}"): ("/clusters/local", None),
            ("POST", "/clusters"): ("/clusters", _cluster("extra")),
            ("DELETE", "/clusters/{name}"): ("/clusters/spare", None),
            ("POST", "/clusters/{name}/cordon"): ("/clusters/spare/cordon", None),
            ("POST", "/clusters/{name}/uncordon"): ("/clusters/spare/uncordon", None),
            ("POST", "/clusters/{name}/drain"): ("/clusters/spare/drain", None),
            ("POST", "/deployments"): ("/deployments?dry_run=true", DEPLOYMENT),
            ("GET", "/deployments"): ("/deployments", None),
            ("GET", "/deployments/watch"): ("/deployments/watch?timeout_s=0", None),
            ("POST", "/deployments/load"): ("/deployments/load", {"gateway": "g", "models": []}),
            ("GET", "/deployments/{name}"): ("/deployments/chat", None),
            ("POST", "/deployments/{name}/scale"): ("/deployments/chat/scale", {"replicas": 2}),
            ("GET", "/deployments/{name}/rollout"): ("/deployments/chat/rollout", None),
            ("POST", "/deployments/{name}/promote"): ("/deployments/chat/promote", None),
            ("POST", "/deployments/{name}/rollback"): ("/deployments/chat/rollback", None),
            ("DELETE", "/deployments/{name}"): ("/deployments/chat", None),
            ("POST", "/deployments/{name}/faults"): (
                "/deployments/chat/faults?dry_run=true",
                {"fault": "crash"},
            ),
            ("GET", "/nodes"): ("/nodes", None),
            ("POST", "/jobs"): ("/jobs", job("new", command=["true"])),
            ("POST", "/jobs/batch"): ("/jobs/batch", [job("b1", command=["true"])]),
            ("GET", "/jobs"): ("/jobs", None),
            ("GET", "/jobs/{ref}"): (f"/jobs/{j}", None),
            ("POST", "/jobs/{ref}/cancel"): (f"/jobs/{j}/cancel", None),
            ("POST", "/jobs/{ref}/move"): (f"/jobs/{j}/move", {"cluster": "local", "node": "n1"}),
            ("GET", "/jobs/{ref}/logs"): (f"/jobs/{j}/logs", None),
            ("GET", "/teams"): ("/teams", None),
            ("GET", "/quotas"): ("/quotas", None),
            ("GET", "/teams/{name}"): ("/teams/research", None),
            ("PUT", "/teams/{name}"): ("/teams/research", {"weight": 2}),
            ("PUT", "/teams/{name}/quotas/{flavor}"): (
                f"/teams/research/quotas/{A100}",
                {"gpus": 1},
            ),
            ("GET", "/teams/{name}/secrets"): ("/teams/research/secrets", None),
            ("PUT", "/teams/{name}/secrets/{secret}"): (
                "/teams/research/secrets/k",
                {"value": "v"},
            ),
            ("DELETE", "/teams/{name}/secrets/{secret}"): ("/teams/research/secrets/old", None),
            ("GET", "/events"): ("/events", None),
            ("GET", "/usage"): ("/usage?since=1h", None),
            ("GET", "/tokens"): ("/tokens", None),
            ("POST", "/tokens"): ("/tokens", {"role": "viewer", "team": "research"}),
            ("DELETE", "/tokens/{token_id}"): (f"/tokens/{self.token_id}", None),
            ("GET", "/ui/login"): ("/ui/login", None),
            ("POST", "/ui/login"): ("/ui/login", {"token": self.tokens["viewer"]}),
            ("POST", "/ui/logout"): ("/ui/logout", {}),
            ("GET", "/ui/console.css"): ("/ui/console.css", None),
            ("GET", "/ui"): ("/ui", None),
            ("GET", "/ui/jobs"): ("/ui/jobs", None),
            ("GET", "/ui/jobs/{ref}"): (f"/ui/jobs/{j}", None),
            ("POST", "/ui/jobs/{ref}/cancel"): (f"/ui/jobs/{j}/cancel", {}),
            ("GET", "/ui/quotas"): ("/ui/quotas", None),
            ("GET", "/ui/gpus"): ("/ui/gpus", None),
            ("GET", "/ui/events"): ("/ui/events", None),
            ("GET", "/ui/deployments"): ("/ui/deployments", None),
            ("GET", "/ui/deployments/{name}"): ("/ui/deployments/chat", None),
            ("GET", "/ui/runs"): ("/ui/runs", None),
            ("GET", "/ui/runs/{team}/{name}"): ("/ui/runs/research/toy", None),
        }

    def console(self, method: str, url: str, body: Any = None, as_: str | None = None) -> Any:
        """A console call from a browser of its own, logged in as `as_` if given; a form
        carries the session's CSRF token."""
        browser, csrf = console_client(self.http, self.tokens[as_] if as_ else None)
        form = {"csrf": csrf, **body} if method == "POST" else None
        return browser.request(method, url, data=form)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    runs = {"research": str(tmp_path / "runs")}
    svc = make_service(
        config(str(tmp_path), nodes=2, teams=TEAMS).model_copy(update={"runs_dirs": runs})
    )
    try:
        batch_run(tmp_path / "runs" / "toy", tmp_path / "batch")
        tokens = {
            r: svc.tokens.create("test", Role(r), "research")[1] for r in ("viewer", "member")
        }
        tokens["admin"] = admin_token(svc)
        tokens["other"] = svc.tokens.create("test", Role.member, "vision")[1]
        spare, _ = svc.tokens.create("spare", Role.viewer, "research")
        job_id = svc.submit(job("mine"))["id"]
        svc.vault.set("research", "old", "x")
        svc.clusters.add(ClusterConfig.model_validate(_cluster("spare")))
        svc.deployments.apply(DEPLOYMENT)
        with TestClient(control_app(svc, background=False), base_url="http://127.0.0.1") as http:
            yield World(svc, http, tokens, job_id, spare.id)
    finally:
        svc.close()


def test_every_route_of_the_app_has_a_policy_row_and_a_call_here(world: World) -> None:
    served = set(_endpoints(world.http.app.routes))  # type: ignore[attr-defined]
    assert served == set(POLICY), "a route without a row (or a row without a route)"
    assert set(world.calls()) == served, "a route this test does not call"


_BELOW = {Role.viewer: None, Role.member: "viewer", Role.admin: "member"}


@pytest.mark.parametrize("route", sorted(POLICY), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_row_of_the_policy_table_holds(world: World, route: tuple[str, str]) -> None:
    rule = POLICY[route]
    url, body = world.calls()[route]
    method = route[0]
    if rule.console:
        _console_row_holds(world, route, url, body)
        return
    anonymous = world.call(method, url, body)
    if rule.role is None:
        assert anonymous.status_code == 200, anonymous.text
        return
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in anonymous.json()["detail"]
    below = _BELOW[rule.role]
    if below is not None:
        refused = world.call(method, url, body, as_=below)
        assert refused.status_code == 403, refused.text
        assert f"needs the {rule.role} role" in refused.json()["detail"]
    if rule.team_scoped:  # another team's member sees nothing of research's
        other = world.call(method, url, body, as_="other")
        if "{" in route[1] or method != "GET":
            assert other.status_code in (403, 404), other.text
        else:
            assert "research" not in other.text
            assert other.status_code == 200
    allowed = world.call(method, url, body, as_=rule.role.value)
    assert allowed.status_code < 400, allowed.text


def _console_row_holds(world: World, route: tuple[str, str], url: str, body: Any) -> None:
    """A console row: the caller is the session's; one not logged in goes to the login page."""
    rule, method = POLICY[route], route[0]
    anonymous = world.console(method, url, body)
    if rule.role is None:
        assert anonymous.status_code < 400, anonymous.text
        return
    assert anonymous.status_code == 303
    assert anonymous.headers["location"] == "/ui/login"
    below = _BELOW[rule.role]
    if below is not None:
        refused = world.console(method, url, body, as_=below)
        assert refused.status_code == 403, refused.text
        assert f"needs the {rule.role} role" in refused.text
    if rule.team_scoped:
        other = world.console(method, url, body, as_="other")
        if "{" in route[1] or method != "GET":
            assert other.status_code == 404, other.text
        else:
            assert other.status_code == 200, other.text
            assert "research" not in other.text
    allowed = world.console(method, url, body, as_=rule.role.value)
    assert allowed.status_code < 400, allowed.text


# -- the attacks of issue 23 ---------------------------------------------------------------------


def test_an_anonymous_caller_can_neither_submit_nor_cancel_nor_set_quotas(world: World) -> None:
    with world.svc.store.session() as session:
        before = session.scalars(select(Job.name)).all()
    assert world.call("POST", "/jobs", job("evil", command=["true"])).status_code == 401
    assert world.call("POST", f"/jobs/{world.job_id}/cancel").status_code == 401
    assert world.call("PUT", f"/teams/research/quotas/{A100}", {"gpus": 0}).status_code == 401
    assert world.call("PUT", "/teams/vision/quotas/{A100}", {"gpus": 100}).status_code == 401
    with world.svc.store.session() as session:
        assert session.scalars(select(Job.name)).all() == before
    assert "evil" not in before
    assert state(world.svc, world.job_id).state == "running"
    assert not world.call("GET", "/teams", as_="admin").json()[0]["limited"]


def test_a_bad_token_is_refused_like_none(world: World) -> None:
    for bad in ("nonsense", "gpl_", "gpl_abc_def", world.tokens["member"] + "x"):
        r = world.http.get("/jobs", headers={"authorization": f"Bearer {bad}"})
        assert r.status_code == 401, bad


def test_another_teams_job_answers_404_exactly_as_an_unknown_one(world: World) -> None:
    theirs = world.call("GET", f"/jobs/{world.job_id}", as_="other")
    unknown = world.call("GET", "/jobs/no-such-job", as_="other")
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["detail"].replace(world.job_id, "X") == unknown.json()["detail"].replace(
        "no-such-job", "X"
    )
    by_name = world.call("GET", "/jobs/mine", as_="other")
    assert by_name.status_code == 404
    assert world.call("GET", "/jobs", as_="other").json() == []
    assert [t["name"] for t in world.call("GET", "/teams", as_="other").json()] == ["vision"]
    assert world.call("GET", "/teams/research", as_="other").status_code == 404
    asked = world.call("GET", "/jobs?team=research", as_="other")
    assert asked.status_code == 404
    assert "valid: vision" in asked.json()["detail"]


def test_a_member_cannot_cancel_another_teams_job(world: World) -> None:
    r = world.call("POST", f"/jobs/{world.job_id}/cancel", as_="other")
    assert r.status_code == 404
    assert state(world.svc, world.job_id).state == "running"
    mine = world.call("POST", f"/jobs/{world.job_id}/cancel", as_="member")
    assert mine.status_code == 200
    assert mine.json()["state"] == "cancelled"


def test_a_member_cannot_submit_as_another_team_and_submits_as_its_own_by_default(
    world: World,
) -> None:
    r = world.call("POST", "/jobs", job("sneak", team="research", command=["true"]), as_="other")
    assert r.status_code == 403
    assert "your token is for team vision" in r.json()["detail"]
    spec = job("plain", command=["true"])
    del spec["team"]
    ok = world.call("POST", "/jobs", spec, as_="other")
    assert ok.status_code == 201
    assert ok.json()["team"] == "vision"


def test_a_cross_site_form_post_cannot_cancel_a_job(world: World) -> None:
    # what a page on another origin can make a browser send: a form, with cookies, no bearer
    r = world.http.post(
        f"/jobs/{world.job_id}/cancel",
        content=b"x=1",
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "origin": "http://evil.example",
            "cookie": "session=anything",
        },
    )
    assert r.status_code == 401
    assert state(world.svc, world.job_id).state == "running"


def test_a_host_header_not_allowed_gets_400_even_with_a_token(world: World) -> None:
    r = world.http.get(
        "/jobs",
        headers={"host": "evil.example", "authorization": f"Bearer {world.tokens['admin']}"},
    )
    assert r.status_code == 400
    for host in ("127.0.0.1:8080", "localhost"):
        ok = world.http.get("/healthz", headers={"host": host})
        assert ok.status_code == 200, host


_DEPLOYMENT_CALLS = [
    ("GET", "/deployments/{}", None),
    ("GET", "/deployments/{}/rollout", None),
    ("POST", "/deployments/{}/scale", {"replicas": 3}),
    ("POST", "/deployments/{}/promote", None),
    ("POST", "/deployments/{}/rollback", None),
    ("DELETE", "/deployments/{}", None),
]


def test_another_teams_deployment_answers_404_exactly_as_an_unknown_one(world: World) -> None:
    for method, path, body in _DEPLOYMENT_CALLS:
        theirs = world.call(method, path.format("chat"), body, as_="other")
        unknown = world.call(method, path.format("nosuch"), body, as_="other")
        assert theirs.status_code == unknown.status_code == 404, (path, theirs.text)
        assert theirs.json()["detail"].replace("chat", "X") == unknown.json()["detail"].replace(
            "nosuch", "X"
        )
    assert world.call("GET", "/deployments", as_="other").json() == []
    # nothing of the calls above took effect
    chat = world.call("GET", "/deployments/chat", as_="viewer").json()
    assert (chat["replicas"], chat["deleting"]) == (1, False)
    assert [v["version"] for v in world.call("GET", "/deployments/chat/rollout", as_="viewer")
            .json()["versions"]] == ["v1", "v2"]  # fmt: skip
    assert [d["name"] for d in world.call("GET", "/deployments", as_="viewer").json()] == ["chat"]
    # the gateway's watch, with an admin token, sees every team's; a member's token cannot watch
    watched = world.call("GET", "/deployments/watch?timeout_s=0", as_="admin").json()
    assert [m["name"] for m in watched["models"]] == ["chat"]
    assert world.call("GET", "/deployments/watch?timeout_s=0", as_="other").status_code == 403


def test_a_member_manages_its_own_teams_deployments_only(world: World) -> None:
    scaled = world.call("POST", "/deployments/chat/scale", {"replicas": 0}, as_="member")
    assert scaled.status_code == 200, scaled.text
    assert scaled.json()["replicas"] == 0
    sneak = world.call("POST", "/deployments", {**DEPLOYMENT, "name": "sneak"}, as_="other")
    assert sneak.status_code == 403
    assert "submit deployments as team vision" in sneak.json()["detail"]
    spec = {**DEPLOYMENT, "name": "mine", "replicas": 0}
    del spec["team"]
    assert world.call("POST", "/deployments", spec, as_="other").status_code == 201
    assert world.call("GET", "/deployments/mine", as_="other").json()["team"] == "vision"
    assert [d["name"] for d in world.call("GET", "/deployments", as_="other").json()] == ["mine"]
    assert world.call("GET", "/deployments/mine", as_="member").status_code == 404
    # names are one namespace: another team's name is taken, and whose it is is not said
    taken = world.call("POST", "/deployments", {**spec, "name": "chat"}, as_="other")
    assert taken.status_code == 409
    assert "research" not in taken.text
    assert taken.json()["detail"] == "the deployment name chat is taken: choose another name"
    dry = world.call("POST", "/deployments?dry_run=true", {**spec, "name": "chat"}, as_="other")
    assert (dry.status_code, dry.json()) == (409, taken.json())
    assert world.call("GET", "/deployments/chat", as_="viewer").json()["team"] == "research"
    assert world.call("DELETE", "/deployments/mine", as_="other").status_code == 200


def test_a_member_cannot_change_quotas_or_teams(world: World) -> None:
    r = world.call("PUT", f"/teams/research/quotas/{A100}", {"gpus": 100}, as_="member")
    assert r.status_code == 403
    assert "needs the admin role" in r.json()["detail"]
    assert world.call("PUT", "/teams/research", {"weight": 50}, as_="member").status_code == 403
    team = world.call("GET", "/teams/research", as_="member").json()
    assert (team["weight"], team["limited"]) == (1.0, False)


# -- the trail -----------------------------------------------------------------------------------


def test_every_mutation_is_recorded_with_who_what_where_and_result(world: World) -> None:
    for _ in range(3):
        world.call("POST", f"/jobs/{world.job_id}/cancel")  # anonymous: refused, counted only
    world.call("PUT", f"/teams/research/quotas/{A100}", {"gpus": 9}, as_="member")  # refused
    world.call("POST", f"/jobs/{world.job_id}/cancel", as_="member")  # done
    world.call("GET", "/jobs", as_="member")  # a read: not recorded
    trail = [e for e in world.call("GET", "/events", as_="admin").json() if e["kind"] == "api"]
    member = world.svc.authenticate(world.tokens["member"])
    assert member is not None
    got = [(e["message"], e["actor"], e["team"], e["source"], e["status"]) for e in trail]
    assert got == [
        (
            f"PUT /teams/research/quotas/{A100} as member",
            member.subject,
            "research",
            "testclient",
            403,
        ),
        (
            f"POST /jobs/{world.job_id}/cancel as member",
            member.subject,
            "research",
            "testclient",
            200,
        ),
    ]
    # no identity, nothing to record: anonymous calls cannot fill the trail, they are counted
    metrics = world.call("GET", "/metrics", as_="admin").text
    assert 'gpuplane_control_unidentified_calls_total{status="401"} 3.0' in metrics


def test_events_are_filtered_to_the_callers_team_and_by_time(world: World) -> None:
    world.call("POST", "/jobs", job("theirs", team="vision", command=["true"]), as_="other")
    mine = world.call("GET", "/events", as_="member").json()
    assert {e["team"] for e in mine} == {"research"}
    assert "theirs" not in str(mine)
    assert [e["kind"] for e in mine if e["job_id"] == world.job_id][:3] == [
        "submitted",
        "admitted",
        "started",
    ]
    theirs = world.call("GET", "/events?team=research", as_="other").json()
    assert theirs == []
    assert world.call("GET", "/events?since=1h", as_="admin").json()
    assert world.call("GET", "/events?since=soon", as_="admin").status_code == 422


def test_a_jobs_timeline_comes_with_it(world: World) -> None:
    world.call("POST", f"/jobs/{world.job_id}/cancel", as_="member")
    timeline = world.call("GET", f"/jobs/{world.job_id}", as_="viewer").json()["timeline"]
    kinds = [e["kind"] for e in timeline]
    assert kinds == ["submitted", "admitted", "started", "cancelled"], kinds
    assert timeline[-1]["message"] == "cancelled by a user"
    assert all(a["at"] <= b["at"] for a, b in itertools.pairwise(timeline))
    assert world.call("GET", "/jobs", as_="viewer").json()[0]["timeline"] == []


# -- tokens ----------------------------------------------------------------------------------------


def test_a_token_is_stored_only_as_a_keyed_hash_and_shown_once(world: World) -> None:
    made = world.call("POST", "/tokens", {"role": "member", "team": "vision"}, as_="admin").json()
    secret = made["token"]
    assert world.http.get("/jobs", headers={"authorization": f"Bearer {secret}"}).status_code == 200
    listed = world.call("GET", "/tokens", as_="admin").text
    assert made["id"] in listed
    assert secret not in listed
    with world.svc.store.session() as session:
        for row in session.scalars(select(ApiToken)):
            assert secret not in repr(vars(row))
    db = Path(world.svc.config.state_dir)
    assert all(secret.encode() not in p.read_bytes() for p in db.glob("control.db*"))


def test_a_revoked_token_stops_working_and_revoking_again_changes_nothing(world: World) -> None:
    made = world.call("POST", "/tokens", {"role": "viewer", "team": "vision"}, as_="admin").json()
    auth = {"authorization": f"Bearer {made['token']}"}
    assert world.http.get("/jobs", headers=auth).status_code == 200
    first = world.call("DELETE", f"/tokens/{made['id']}", as_="admin").json()
    again = world.call("DELETE", f"/tokens/{made['id']}", as_="admin").json()
    assert first["revoked_at"] == again["revoked_at"] is not None
    assert world.http.get("/jobs", headers=auth).status_code == 401
    assert world.call("DELETE", "/tokens/nope", as_="admin").status_code == 404


def test_a_token_of_a_role_below_admin_names_its_team(world: World) -> None:
    r = world.call("POST", "/tokens", {"role": "member"}, as_="admin")
    assert r.status_code == 422
    assert "give --team" in r.json()["detail"]
    r = world.call("POST", "/tokens", {"role": "member", "team": "nosuch"}, as_="admin")
    assert r.status_code == 404


def test_a_token_past_its_expiry_is_refused(world: World) -> None:
    now = [1000.0]
    book = TokenBook(world.svc.store, world.svc.tokens.key, lambda: now[0])
    _, token = book.create("short", Role.viewer, "research", ttl_s=60)
    assert book.verify(token) is not None
    now[0] += 60
    assert book.verify(token) is None


def test_the_local_admin_token_and_the_keys_are_the_owners_only(world: World) -> None:
    root = Path(world.svc.config.state_dir)
    for name in ("admin.token", "auth.key", "secrets.key"):
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o600, name


def test_a_revoked_local_admin_token_is_made_anew_at_the_next_start(world: World) -> None:
    old = admin_token(world.svc)
    world.svc.tokens.revoke(old.split("_")[1])
    world.svc.tokens.local_admin(Path(world.svc.config.state_dir))
    new = admin_token(world.svc)
    assert new != old
    assert world.svc.authenticate(new) is not None


# -- listening beyond loopback ------------------------------------------------------------------


def test_listening_beyond_loopback_without_allowed_hosts_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"set control\.auth\.allowed_hosts"):
        ControlConfig(host="0.0.0.0")
    open_ = ControlConfig(host="0.0.0.0", auth=AuthConfig(allowed_hosts=["gpus.example.com"]))
    assert open_.served_hosts() == ["gpus.example.com"]
    assert "localhost" in ControlConfig().served_hosts()


def test_control_serve_beyond_loopback_says_what_to_set(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuplane.cli.main import app

    r = CliRunner().invoke(
        app, ["control", "serve", "--host", "0.0.0.0", "--db", f"sqlite:///{tmp_path}/x.db"]
    )
    assert r.exit_code == 1
    assert "set control.auth.allowed_hosts" in r.output


# -- OIDC ----------------------------------------------------------------------------------------


def test_an_oidc_jwt_is_checked_and_its_claims_give_team_and_role(tmp_path: Path) -> None:
    import json
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (tmp_path / "jwks.json").write_text(
        json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256"}]})
    )
    oidc = OidcConfig(
        issuer="https://idp.example", audience="gpuplane", jwks_file=str(tmp_path / "jwks.json")
    )
    cfg = config(str(tmp_path / "state"), teams=TEAMS)
    svc = make_service(cfg.model_copy(update={"auth": AuthConfig(oidc=oidc)}))

    def token(signer: Any = key, **claims: Any) -> str:
        base = {
            "iss": "https://idp.example",
            "aud": "gpuplane",
            "sub": "alice",
            "exp": time.time() + 300,
            "team": "vision",
            "role": "member",
        }
        return jwt.encode({**base, **claims}, signer, algorithm="RS256", headers={"kid": "k1"})

    try:
        with api_client(svc, token()) as c:
            assert [t["name"] for t in c.get("/teams").json()] == ["vision"]
            assert c.put("/teams/vision", json={"weight": 2}).status_code == 403
        with api_client(svc, token(role="admin", team=None)) as c:
            assert c.put("/teams/vision", json={"weight": 2}).status_code == 200
        for bad in (
            token(aud="another-service"),
            token(iss="https://evil.example"),
            token(exp=time.time() - 1),
            token(role="owner"),
            token(team=None),
            token(signer=stranger),
        ):
            with api_client(svc, bad) as c:
                assert c.get("/teams").status_code == 401
        with api_client(svc) as c:  # API tokens still work beside OIDC
            assert c.get("/teams").status_code == 200
    finally:
        svc.close()
