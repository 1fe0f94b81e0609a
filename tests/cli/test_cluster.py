"""`gpuplane cluster add | list | describe | cordon | uncordon | drain | remove` against a real API
in a thread, with local clusters; refusals say what was wrong and what to do."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from gpuplane.control.service.service import ControlService
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import job, state


@pytest.fixture
def url(service: ControlService) -> Iterator[str]:
    with serving(service) as u:
        yield u


def test_add_list_describe_and_remove_a_cluster(service: ControlService, url: str) -> None:
    code, out = cli(url, "cluster", "add", "spare", "--adapter", "local", "--region", "eu")
    assert code == 0, out
    assert "added (stored)" in out
    code, out = cli(url, "cluster", "list", "-o", "json")
    clusters = {c["name"]: c for c in json.loads(out)}
    assert (clusters["local"]["source"], clusters["spare"]["source"]) == ("config", "api")
    assert clusters["spare"]["labels"]["gpuplane.io/region"] == "eu"
    assert clusters["spare"]["health"] == "ok"
    assert clusters["spare"]["last_sync_at"].endswith("Z")
    code, out = cli(url, "cluster", "describe", "spare", "-o", "yaml")
    described = yaml.safe_load(out)
    assert described["settings"] == {"name": "spare", "region": "eu"}
    assert described["gpus"] == 2
    code, out = cli(url, "cluster", "list")
    assert code == 0
    assert "spare" in out
    assert "ready" in out

    code, out = cli(url, "cluster", "remove", "local")
    assert code == 1
    assert "declared in gpuplane.yaml (control.clusters); delete it there" in out
    code, out = cli(url, "cluster", "remove", "spare")
    assert (code, out.strip()) == (0, "cluster spare removed")
    assert [c["name"] for c in json.loads(cli(url, "cluster", "list", "-o", "json")[1])] == [
        "local"
    ]


def test_add_refuses_an_unknown_adapter_before_asking_the_server() -> None:
    nowhere = "http://127.0.0.1:9"  # nothing listens: the refusal comes first
    code, out = cli(nowhere, "cluster", "add", "x", "--adapter", "kubernets")
    assert code == 1
    assert "--adapter: unknown cluster adapter 'kubernets' (did you mean 'kubernetes'?)" in out
    code, out = cli(nowhere, "cluster", "add", "x", "--adapter", "ray")
    assert code == 1
    assert "a ray cluster needs `address`" in out
    code, out = cli(nowhere, "cluster", "add", "x", "--adapter", "local", "--label", "oops")
    assert code == 1
    assert "give KEY=VALUE" in out


def test_add_refuses_an_address_that_does_not_answer_saying_what_was_tried(url: str) -> None:
    code, out = cli(
        url, "cluster", "add", "lab", "--adapter", "ray", "--address", "http://127.0.0.1:9",
        "--sync-interval", "1",
    )  # fmt: skip
    assert code == 1
    assert "HTTP 422" in out
    assert "http://127.0.0.1:9" in out
    assert "unreachable" in out
    code, out = cli(url, "cluster", "add", "local", "--adapter", "local")
    assert code == 1
    assert "cluster local already exists (declared in gpuplane.yaml)" in out


def test_cordon_drain_and_uncordon(service: ControlService, url: str) -> None:
    running = service.submit(job("running", gpus=1))["id"]
    code, out = cli(url, "cluster", "cordon", "local")
    assert (code, out.strip()) == (0, "cluster local cordoned: nothing new is placed there")
    assert json.loads(cli(url, "cluster", "describe", "local", "-o", "json")[1])["cordoned"]
    waiting = service.submit(job("waiting", gpus=1))["id"]
    assert state(service, waiting).state == "pending"
    code, out = cli(url, "cluster", "drain", "local")
    assert code == 0
    assert "cluster local draining: 0 job(s) requeued, 1 running job(s) left to finish" in out
    code, out = cli(url, "cluster", "drain", "local", "--requeue", "-o", "json")
    assert json.loads(out)["requeued"] == [running]
    assert json.loads(out)["cluster"]["draining"] is True
    code, out = cli(url, "cluster", "list")
    assert "draining" in out
    code, out = cli(url, "cluster", "uncordon", "local")
    assert code == 0
    service.tick()
    assert {state(service, j).state for j in (running, waiting)} == {"running"}
    code, out = cli(url, "cluster", "cordon", "nowhere")
    assert code == 1
    assert "unknown cluster 'nowhere'" in out
    assert "HTTP 404" in out
