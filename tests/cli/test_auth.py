"""`gpuplane token` and how the CLI finds its token: --token or GPUPLANE_TOKEN, else the admin
token a server on this machine wrote to ./.gpuplane/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuplane.control.client import local_token
from gpuplane.control.identity.auth import Role
from gpuplane.control.service.service import ControlService
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import config, job, make_service, wait_state


def test_a_token_made_by_the_cli_is_shown_once_works_and_can_be_revoked(
    service: ControlService,
) -> None:
    with serving(service) as url:
        code, out = cli(
            url,
            "token",
            "create",
            "--role",
            "viewer",
            "--team",
            "research",
            "--expires",
            "30d",
            "-o",
            "json",
        )
        assert code == 0, out
        made = json.loads(out)
        assert made["token"].startswith("gpl_")
        assert made["expires_at"] > made["created_at"]
        code, out = cli(url, "job", "list", token=made["token"])
        assert code == 0, out
        code, out = cli(url, "token", "list")
        assert code == 0
        assert made["id"] in out
        assert made["token"] not in out
        code, out = cli(url, "token", "revoke", made["id"])
        assert code == 0, out
        code, out = cli(url, "job", "list", token=made["token"])
        assert code == 1
        assert "HTTP 401" in out
        code, out = cli(url, "token", "create", "--role", "viewer", "--expires", "soon")
        assert code == 1
        assert "--expires" in out


def test_a_viewer_is_told_which_role_it_lacks(service: ControlService) -> None:
    _, viewer = service.tokens.create("v", Role.viewer, "research")
    with serving(service) as url:
        code, out = cli(url, "quota", "set", "research", "--weight", "2", token=viewer)
        assert code == 1
        assert "HTTP 403" in out
        assert "needs the admin role" in out


def test_the_cli_finds_a_local_servers_admin_token_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPLANE_TOKEN", raising=False)
    svc = make_service(config(".gpuplane"))  # the default state dir, under the current dir
    try:
        with serving(svc) as url:
            code, out = cli(url, "job", "list", token="")
            assert code == 0, out
    finally:
        svc.close()
    # the file is this machine's: never sent to a server elsewhere
    assert local_token("http://127.0.0.1:8080") is not None
    assert local_token("http://gpus.example.com:8080") is None


def test_events_and_the_timeline_in_describe(service: ControlService) -> None:
    job_id = service.submit(job("traced", command=["true"]))["id"]
    wait_state(service, job_id, "succeeded")
    with serving(service) as url:
        code, out = cli(url, "job", "describe", job_id)
        assert code == 0, out
        timeline = out[out.index("timeline") :]
        for kind in ("submitted", "admitted", "started", "succeeded"):
            assert f"{kind}: " in timeline, out
        assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \((\d+\w+ ago|now)\)", timeline)
        cli(url, "quota", "set", "research", "--weight", "3")
        code, out = cli(url, "events", "--since", "1h", "-o", "json")
        assert code == 0, out
        rows = json.loads(out)
        assert rows[-1]["message"] == "PUT /teams/research as admin"
        assert rows[-1]["status"] == 200
        assert rows[-1]["at"].endswith("Z")
        code, out = cli(url, "events", "--since", "later")
        assert code == 1
        assert "since" in out
