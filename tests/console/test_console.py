"""The web console through the ASGI app: the session cookie's flags, CSRF, a cookie that cannot
call the JSON API, team isolation on its pages, logout and revocation, and the quota arithmetic
its queues page shows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpuplane.console.mount import login_url
from gpuplane.console.render import CSP
from gpuplane.console.sessions import Sessions, csrf_matches
from gpuplane.console.shapes import quota_rows
from gpuplane.control.identity.auth import Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import TeamConfig
from gpuplane.control.store.views import QuotaView, TeamView
from gpuplane.plane import control_app
from tests.console.console_helpers import console_client, login
from tests.control.svc_helpers import admin_token, config, job, make_service, state


@dataclass
class Plane:
    svc: ControlService
    http: TestClient
    job_id: str  # research's, running on one card
    member: str  # research
    other: str  # a member of vision


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    teams = (TeamConfig(name="research"), TeamConfig(name="vision"))
    svc = make_service(config(str(tmp_path), teams=teams))
    try:
        member = svc.tokens.create("m", Role.member, "research")[1]
        other = svc.tokens.create("o", Role.member, "vision")[1]
        job_id = svc.submit(job("mine", gpus=1))["id"]
        with TestClient(control_app(svc, background=False), base_url="http://127.0.0.1") as http:
            yield Plane(svc, http, job_id, member, other)
    finally:
        svc.close()


def test_login_sets_an_httponly_samesite_strict_cookie_and_a_bad_token_gets_none(
    plane: Plane,
) -> None:
    browser, _ = console_client(plane.http)
    r = browser.post("/ui/login", data={"token": plane.member})
    assert r.status_code == 303
    assert r.headers["location"] == "/ui"
    cookie = r.headers["set-cookie"].lower()
    for flag in ("httponly", "samesite=strict", "path=/ui"):
        assert flag in cookie
    assert plane.member not in r.headers["set-cookie"]  # a random id, not the token

    refused = browser.post("/ui/login", data={"token": plane.member + "x"})
    assert refused.status_code == 401
    assert "set-cookie" not in refused.headers
    assert "that token is not valid" in refused.text


def test_pages_forbid_every_source_but_the_server(plane: Plane) -> None:
    browser, _ = console_client(plane.http, plane.member)
    for page in ("/ui", "/ui/jobs", f"/ui/jobs/{plane.job_id}", "/ui/gpus", "/ui/login"):
        r = browser.get(page)
        assert r.status_code == 200, page
        assert r.headers["content-security-policy"] == CSP
    assert "default-src 'none'" in CSP


def test_a_cancel_without_the_sessions_csrf_token_is_refused(plane: Plane) -> None:
    browser, csrf = console_client(plane.http, plane.member)
    url = f"/ui/jobs/{plane.job_id}/cancel"
    for form in ({}, {"csrf": "forged"}, {"csrf": csrf + "x"}):
        r = browser.post(url, data=form)
        assert r.status_code == 403, form
        assert "CSRF token is missing or stale" in r.text
    assert state(plane.svc, plane.job_id).state == "running"
    # another session's token is not this one's
    _, theirs = console_client(plane.http, plane.member)
    assert browser.post(url, data={"csrf": theirs}).status_code == 403

    done = browser.post(url, data={"csrf": csrf})
    assert done.status_code == 303
    assert done.headers["location"] == f"/ui/jobs/{plane.job_id}"
    assert state(plane.svc, plane.job_id).state == "cancelled"
    page = browser.get(f"/ui/jobs/{plane.job_id}").text
    assert "cancelled by a user" in page
    assert 'id="cancel"' not in page  # nothing left to cancel


def test_a_form_posted_from_another_site_is_refused_even_with_a_valid_token(plane: Plane) -> None:
    browser, csrf = console_client(plane.http, plane.member)
    evil = {"origin": "http://evil.example"}
    refused = browser.post("/ui/login", data={"token": plane.other}, headers=evil)
    assert refused.status_code == 403
    assert "posted from http://evil.example" in refused.text
    assert "set-cookie" not in refused.headers
    url = f"/ui/jobs/{plane.job_id}/cancel"
    assert browser.post(url, data={"csrf": csrf}, headers=evil).status_code == 403
    assert state(plane.svc, plane.job_id).state == "running"
    own = {"origin": "http://127.0.0.1"}
    assert browser.post(url, data={"csrf": csrf}, headers=own).status_code == 303


def test_the_console_cookie_alone_cannot_call_the_json_api(plane: Plane) -> None:
    browser, _ = console_client(plane.http, plane.member)
    assert browser.get("/ui/jobs").status_code == 200
    assert browser.get("/jobs").status_code == 401
    cancel = browser.post(f"/jobs/{plane.job_id}/cancel")
    assert cancel.status_code == 401
    assert state(plane.svc, plane.job_id).state == "running"


def test_a_member_sees_only_their_team_and_another_teams_job_is_404(plane: Plane) -> None:
    browser, csrf = console_client(plane.http, plane.other)
    for page in ("/ui/jobs", "/ui/events", "/ui/quotas", "/ui/gpus"):
        text = browser.get(page).text
        assert plane.job_id not in text, page
        assert "research" not in text, page
    theirs = browser.get(f"/ui/jobs/{plane.job_id}")
    assert theirs.status_code == 404
    assert browser.get("/ui/jobs/no-such-job").status_code == 404
    assert browser.post(f"/ui/jobs/{plane.job_id}/cancel", data={"csrf": csrf}).status_code == 404
    assert state(plane.svc, plane.job_id).state == "running"
    assert "held by another team" in browser.get("/ui/gpus").text  # the card is held, not named
    assert browser.get("/ui/jobs?team=research").status_code == 404

    mine, _ = console_client(plane.http, plane.member)
    assert plane.job_id in mine.get("/ui/jobs").text
    assert plane.job_id in mine.get("/ui/gpus").text


def test_a_viewer_sees_jobs_but_gets_no_cancel_button_and_may_not_cancel(plane: Plane) -> None:
    viewer = plane.svc.tokens.create("v", Role.viewer, "research")[1]
    browser, csrf = console_client(plane.http, viewer)
    page = browser.get(f"/ui/jobs/{plane.job_id}")
    assert page.status_code == 200
    assert 'id="cancel"' not in page.text
    refused = browser.post(f"/ui/jobs/{plane.job_id}/cancel", data={"csrf": csrf})
    assert refused.status_code == 403
    assert "needs the member role" in refused.text


def test_logout_and_revoking_the_token_end_the_session(plane: Plane) -> None:
    browser, csrf = console_client(plane.http, plane.member)
    cookie = browser.cookies.get("gpuplane_console")
    out = browser.post("/ui/logout", data={"csrf": csrf})
    assert out.status_code == 303
    assert out.headers["location"] == "/ui/login"
    replayed, _ = console_client(plane.http)
    replayed.cookies.set("gpuplane_console", str(cookie), domain="127.0.0.1", path="/ui")
    assert replayed.get("/ui").headers["location"] == "/ui/login"

    info, token = plane.svc.tokens.create("short", Role.member, "research")
    browser, _ = console_client(plane.http, token)
    assert browser.get("/ui").status_code == 200
    plane.svc.tokens.revoke(info.id)
    assert browser.get("/ui").headers["location"] == "/ui/login"


def test_an_anonymous_browser_is_sent_to_the_login_page(plane: Plane) -> None:
    browser, _ = console_client(plane.http)
    for page in ("/ui", "/ui/jobs", f"/ui/jobs/{plane.job_id}", "/ui/events"):
        r = browser.get(page)
        assert r.status_code == 303
        assert r.headers["location"] == "/ui/login"
    login(browser, admin_token(plane.svc))
    assert browser.get("/ui/gpus").status_code == 200


def _team(
    name: str, cohort: str | None, nominal: float, used: float, lend: float | None = None
) -> TeamView:
    quota = QuotaView(
        flavor="a100",
        gpus=nominal,
        gpu_mem_mib=None,
        borrowing_limit_gpus=None,
        borrowing_limit_mem_mib=None,
        lending_limit_gpus=lend,
        used_gpus=used,
        used_gpu_mem_mib=0,
    )
    return TeamView(
        name=name,
        cohort=cohort,
        weight=1.0,
        limited=True,
        quotas=[quota],
        used_gpus=used,
        used_gpu_mem_mib=0,
        dominant_share=0.0,
    )


def test_quota_rows_show_what_a_team_borrowed_and_what_its_cohort_lent_it() -> None:
    teams = [
        _team("a", "pool", nominal=4, used=7),  # borrows 3
        _team("b", "pool", nominal=4, used=0),  # 4 idle
        _team("c", "pool", nominal=4, used=2, lend=1),  # 2 idle, 1 of them lendable
        _team("solo", None, nominal=2, used=0),  # no cohort: lends nothing
    ]
    rows = {r.team: r for r in quota_rows(teams, None)}
    assert rows["a"].borrowed_gpus == 3
    assert rows["a"].lent_gpus == 0
    assert rows["b"].lent_gpus == pytest.approx(3 * 4 / 5)
    assert rows["c"].lent_gpus == pytest.approx(3 * 1 / 5)
    assert rows["b"].lent_gpus + rows["c"].lent_gpus == pytest.approx(3)
    assert rows["solo"].lent_gpus == 0
    assert [r.team for r in quota_rows(teams, {"b"})] == ["b"]
    assert quota_rows(teams, {"b"})[0].lent_gpus == rows["b"].lent_gpus


def test_a_session_ends_at_its_ttl_and_closing_it_twice_changes_nothing() -> None:
    now = [1000.0]
    sessions = Sessions(lambda: now[0], ttl_s=60)
    sid, opened = sessions.open("gpl_x_y")
    assert sessions.get(sid) == opened
    assert csrf_matches(opened, opened.csrf)
    assert not csrf_matches(opened, None)
    assert not csrf_matches(None, opened.csrf)
    now[0] += 60
    assert sessions.get(sid) is None  # expired
    assert sessions.get(None) is None
    sessions.close(sid)
    sessions.close(sid)
    sessions.close("unknown")


def test_a_one_time_login_link_logs_a_browser_in_once(plane: Plane) -> None:
    """As Jupyter prints at start: the URL logs in without pasting a token, and is then void."""
    app = plane.http.app
    assert isinstance(app, FastAPI)
    url = login_url(app, "http://127.0.0.1", admin_token(plane.svc))
    assert admin_token(plane.svc) not in url  # a random code, never the token itself
    browser, _ = console_client(plane.http)
    r = browser.get(url)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui"
    assert "httponly" in r.headers["set-cookie"].lower()
    assert browser.get("/ui").status_code == 200  # logged in

    another, _ = console_client(plane.http)
    again = another.get(url)  # the same link twice: void
    assert again.status_code == 401
    assert "set-cookie" not in again.headers
    assert "already used or has expired" in again.text
    assert another.get("/ui").status_code == 303  # still sent to the login page


def test_a_login_code_is_void_after_its_ttl_or_for_a_revoked_token() -> None:
    now = [1000.0]
    sessions = Sessions(lambda: now[0])
    late = sessions.issue_code("gpl_x_y", ttl_s=60)
    now[0] += 60
    assert sessions.redeem(late) is None
    code = sessions.issue_code("gpl_x_y", ttl_s=60)
    assert sessions.redeem(code) == "gpl_x_y"
    assert sessions.redeem(code) is None
    assert sessions.redeem(None) is None
    assert sessions.redeem("unknown") is None
