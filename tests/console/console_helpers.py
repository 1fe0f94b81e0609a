"""The web console through its forms, as a browser uses it: log in with a token, read the
session's CSRF token off a page; and a real batch run for its batch runs pages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpuplane.batch.clips import list_clips
from gpuplane.batch.driver import Driver, RunOptions
from gpuplane.batch.packing import declared_devices
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.runners.base import WorkerSpec, make_runner
from tests.helpers.batch import TOY, write_clips


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def login(http: TestClient, token: str) -> str:
    """Log `http` into the console with `token`; returns the session's CSRF token."""
    r = http.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return csrf_of(http.get("/ui").text)


def console_client(http: TestClient, token: str | None = None) -> tuple[TestClient, str]:
    """A new browser (its own cookies) on `http`'s app, logged in with `token` if given; its
    CSRF token ("" when not logged in). Redirects are not followed."""
    browser = TestClient(http.app, base_url=str(http.base_url), follow_redirects=False)
    return browser, (login(browser, token) if token else "")


def batch_run(out: Path, work: Path, clips: int = 3) -> dict[str, Any]:
    """The toy pipeline (tests/batch) over `clips` clips with the local runner, its run directory
    `out`, its clips and stage cache under `work`: what `gpuplane batch run` leaves behind."""
    pipe = load_pipeline(TOY, {})
    spec = WorkerSpec(TOY, {}, str(work / "cache"))
    options = RunOptions(
        out_dir=out, devices=declared_devices(2), profile={s.name: 0.01 for s in pipe.stages}
    )
    runner = make_runner("local", threads=True, cpu_slots=2)
    summary: dict[str, Any] = Driver(pipe, spec, runner, options).run(
        list_clips(str(write_clips(work / "clips", clips)))
    )
    return summary
