"""The web console in a real headless Chromium against a control plane served over HTTP: log in
with a token, every page shows the jobs submitted through the API, the deployments applied
through it (on the sim engine, with a gateway's load report) and a real batch run, a cancel from
the page takes effect, a member cannot see another team's job or deployment; no console error and
no request beyond the server. Screenshots of every page are kept under the test's tmp dir (its
path is printed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuplane.control.identity.auth import Role
from gpuplane.control.settings import TeamConfig
from tests.console.console_helpers import batch_run
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
    cfg = config(str(tmp_path / "state"), nodes=2, teams=teams)
    runs = {"research": str(tmp_path / "runs")}
    svc = make_service(cfg.model_copy(update={"runs_dirs": runs}))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    run = batch_run(tmp_path / "runs" / "toy-nightly", tmp_path / "batch")
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
            # a deployment of each team on the sim engine, a member's team by default
            slice_ = {"gpu_mem_mib": 8192, "gpu_cores_pct": 25}
            chat = {"name": "chat", "model": "sim", "engine": "sim", "slice": slice_}
            api("POST", "/deployments", member, {**chat, "version": "v1",
                "canary": [{"version": "v2", "weight": 20}]})  # fmt: skip
            api("POST", "/deployments", other, {**chat, "name": "secret-bot"})
            chat_ids = [i["id"] for i in api("GET", "/deployments/chat", member)["instances"]]
            report = {"name": "chat", "in_flight": 1, "queued": 0, "oldest_wait_s": 0.0,
                      "ready": 2, "instances": {chat_ids[0]: 1}, "ready_ids": chat_ids}  # fmt: skip
            httpx.post(
                url + "/deployments/load",
                json={"gateway": "gw-1", "models": [report]},
                headers={"authorization": f"Bearer {admin}"},
            ).raise_for_status()

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
                    page.click("#windows a[href='/ui?window=1h']")  # the last hour's history
                    page.wait_for_url(url + "/ui?window=1h")
                    history = page.inner_text("#history")
                    assert "local" in history
                    assert A100 in history
                    assert page.locator("#history svg rect").count() > 1
                    shot(page, "overview")

                    page.goto(url + "/ui/deployments")
                    listed = page.inner_text("#deployments")
                    assert "chat" in listed
                    assert "v2 (20 %" in listed
                    assert "secret-bot" not in listed
                    shot(page, "deployments")
                    page.click("#deployments a[href='/ui/deployments/chat']")
                    page.wait_for_url(url + "/ui/deployments/chat")
                    instances = page.inner_text("#instances")
                    assert chat_ids[0] in instances
                    assert "local" in instances
                    assert "1 of" in page.inner_text("#slots")
                    shot(page, "deployment")

                    page.goto(url + "/ui/runs")
                    assert "toy-nightly" in page.inner_text("#runs")
                    shot(page, "runs")
                    page.click("#runs a[href='/ui/runs/research/toy-nightly']")
                    page.wait_for_url(url + "/ui/runs/research/toy-nightly")
                    assert page.inner_text("#status") == run["status"]
                    for stage in run["stages"]:
                        assert stage in page.inner_text("#stages")
                    shot(page, "run")

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
                    hidden = page.goto(f"{url}/ui/deployments/secret-bot")
                    assert hidden is not None
                    assert hidden.status == 404
                    assert "secret-bot" in page.inner_text("#error")  # the name asked for only
                    shot(page, "another-teams-deployment")
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
    assert len(list(shots.glob("*.png"))) == 13
