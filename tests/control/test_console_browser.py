"""The web console in a real headless Chromium against a control plane served over HTTP: log in
with a token, every page shows the jobs submitted through the API, a cancel from the page takes
effect, a member cannot see another team's job; no console error and no request beyond the
server. Screenshots of every page are kept under the test's tmp dir (its path is printed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuplane.control.auth import Role
from gpuplane.control.settings import TeamConfig
from tests.control.api_server import admin_of, serving
from tests.control.svc_helpers import A100, config, job, make_service

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.mark.slow
def test_the_console_in_chromium(tmp_path: Path) -> None:
    if not shutil.which(CHROMIUM) and os.environ.get("CI") != "true":
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import Page, sync_playwright

    teams = (TeamConfig(name="research"), TeamConfig(name="vision"))
    svc = make_service(config(str(tmp_path / "state"), nodes=2, teams=teams))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        member = svc.tokens.create("browser", Role.member, "research")[1]
        other = svc.tokens.create("browser", Role.member, "vision")[1]
        with serving(svc) as url:

            def api(method: str, path: str, token: str, body: Any = None) -> Any:
                headers = {"authorization": f"Bearer {token}"}
                r = httpx.request(method, url + path, json=body, headers=headers)
                assert r.status_code < 300, r.text
                return r.json()

            admin = admin_of(url)
            api("PUT", f"/teams/research/quotas/{A100}", admin, {"gpus": 2})
            train = api("POST", "/jobs", member, job("train", gpus=1))["id"]
            big = api("POST", "/jobs", member, job("big", gpus=2))["id"]
            theirs = api("POST", "/jobs", other, job("theirs", team="vision", gpus=1))["id"]
            assert api("GET", f"/jobs/{train}", member)["state"] == "running"
            assert api("GET", f"/jobs/{big}", member)["state"] == "pending"

            errors: list[str] = []

            def watch(page: Page) -> None:
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on(
                    "request",
                    lambda r: None if r.url.startswith(url) else errors.append(f"left: {r.url}"),
                )

            def shot(page: Page, name: str) -> None:
                page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

            def log_in(page: Page, token: str) -> None:
                page.goto(url + "/ui")
                assert page.url == url + "/ui/login"  # sent there, not logged in
                page.fill("#token", token)
                page.click("button[type=submit]")
                page.wait_for_url(url + "/ui")

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    watch(page)
                    log_in(page, member)
                    assert page.inner_text("#who") == "member of research"
                    assert "local" in page.inner_text("#clusters")
                    assert A100 in page.inner_text("#models")
                    shot(page, "overview")

                    page.goto(url + "/ui/jobs")
                    jobs = page.inner_text("#jobs")
                    assert "train" in jobs
                    assert "big" in jobs
                    assert "theirs" not in jobs
                    why = page.inner_text(f"#jobs tr:has(a[href='/ui/jobs/{big}'])")
                    assert "Quota" in why  # the reason, with its numbers
                    assert "nominal=2000" in why
                    assert "position 1" in why
                    shot(page, "jobs")
                    page.select_option("select[name=state]", "pending")
                    page.click("form.filter button")
                    assert "train" not in page.inner_text("#jobs")

                    page.goto(url + "/ui/quotas")
                    assert A100 in page.inner_text("#quotas")
                    shot(page, "quotas")
                    page.goto(url + "/ui/gpus")
                    cards = page.inner_text("main")
                    assert "train (research)" in cards
                    assert "held by another team" in cards
                    assert "theirs" not in cards
                    shot(page, "gpus")
                    page.goto(url + "/ui/events")
                    assert "submitted" in page.inner_text("#events")
                    shot(page, "events")

                    page.goto(f"{url}/ui/jobs/{train}")
                    assert page.inner_text("#state") == "running"
                    assert "started" in page.inner_text("#timeline")
                    shot(page, "job")
                    with page.expect_navigation():  # the form posts, then lands back here
                        page.click("#cancel")
                    assert page.inner_text("#state") == "cancelled"
                    assert api("GET", f"/jobs/{train}", member)["state"] == "cancelled"
                    shot(page, "job-cancelled")

                    hidden = page.goto(f"{url}/ui/jobs/{theirs}")
                    assert hidden is not None
                    assert hidden.status == 404
                    shot(page, "another-teams-job")
                    # Chromium logs that answer's own 404 as a console error: expected here
                    errors[:] = [e for e in errors if "status of 404" not in e]
                    page.click("header button")  # log out
                    page.wait_for_url(url + "/ui/login")
                    page.goto(url + "/ui/jobs")
                    assert page.url == url + "/ui/login"
                finally:
                    browser.close()
            assert api("GET", f"/jobs/{theirs}", other)["state"] == "running"
            print(f"console screenshots: {shots}")
    finally:
        svc.close()
    assert errors == []  # no console error, no request beyond the server
    assert len(list(shots.glob("*.png"))) == 8
