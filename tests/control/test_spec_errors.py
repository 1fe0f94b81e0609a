"""A mistyped field in a job spec is refused with the nearest valid field, as in the config."""

from __future__ import annotations

from pathlib import Path

from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import api_client

MISTYPED = """\
name: hello
team: research
comand: ["python", "-c", "print(42)"]
resources: {gpus: 1}
"""


def test_the_api_names_the_nearest_field_and_lists_the_valid_ones(service: ControlService) -> None:
    spec = {"name": "hello", "team": "research", "comand": ["true"], "resources": {"gpu": 1}}
    with api_client(service) as client:
        r = client.post("/jobs", json=spec)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "unknown field 'comand' (did you mean 'command'?)" in detail
    assert "valid fields: name, team, command, env, workdir" in detail
    assert "unknown field 'resources.gpu' (did you mean 'gpus'?)" in detail
    assert queries.list_jobs(service) == []


def test_job_submit_says_which_field_was_meant(service: ControlService, tmp_path: Path) -> None:
    path = tmp_path / "hello.yaml"
    path.write_text(MISTYPED)
    with serving(service) as url:
        code, out = cli(url, "job", "submit", str(path))
    assert code == 1
    assert "unknown field 'comand' (did you mean 'command'?)" in " ".join(out.split())
    assert queries.list_jobs(service) == []
