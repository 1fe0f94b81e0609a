"""Discovery's difference against the routers (no network): a new deployment gets a router and
its instances enter unready, one no longer listed drains, and a model of the gateway's own
config is never touched."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gpuplane.config import parse_settings
from gpuplane.serve.discovery import Discovery
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.slots import InstanceState
from tests.helpers.common import gateway_settings

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


def model(name: str, *ids: str) -> dict[str, Any]:
    return {
        "name": name,
        "engine": "sim",
        "upstream_model": "sim",
        "instances": [
            {"id": i, "url": f"http://{i}:1", "capacity": 4, "version": "v1"} for i in ids
        ],
    }


@pytest.fixture
async def gateway() -> Any:
    configured = [{"name": "m", "engine": "sim", "instances": [{"url": "http://configured:1"}]}]
    gw = Gateway(parse_settings(gateway_settings(configured)), control="http://control:1")
    yield gw
    assert gw.discovery is not None
    await gw.discovery.aclose()
    await gw.upstream.aclose()


async def test_a_new_deployment_gets_a_router_with_unready_instances(gateway: Gateway) -> None:
    assert gateway.discovery is not None
    gateway.discovery.apply([model("chat", "a", "b")])
    router = gateway.routers["chat"]
    assert [(i.id, i.state, i.capacity) for i in router.instances] == [
        ("a", InstanceState.UNHEALTHY, 4),
        ("b", InstanceState.UNHEALTHY, 4),
    ]
    assert gateway.upstream_names["chat"] == "sim"


async def test_an_instance_no_longer_listed_drains(gateway: Gateway) -> None:
    assert gateway.discovery is not None
    gateway.discovery.apply([model("chat", "a", "b")])
    router = gateway.routers["chat"]
    router.health.report_success("a")
    router.health.report_success("b")
    held = await router.acquire({}, avoid=frozenset({"b"}))
    gateway.discovery.apply([model("chat", "b", "c")])
    assert {i.id: i.state for i in router.instances} == {
        "a": InstanceState.DRAINING,  # its request runs on
        "b": InstanceState.READY,
        "c": InstanceState.UNHEALTHY,
    }
    router.finish(held)
    gateway.discovery.apply([])  # the deployment was deleted
    assert router.instances == []


async def test_a_model_of_the_config_is_never_touched(gateway: Gateway) -> None:
    assert gateway.discovery is not None
    gateway.discovery.apply([model("m", "x")])
    assert [i.id for i in gateway.routers["m"].instances] == ["http://configured:1"]
    gateway.discovery.apply([])
    assert [i.id for i in gateway.routers["m"].instances] == ["http://configured:1"]


async def test_a_load_report_carries_the_exact_slot_use(gateway: Gateway) -> None:
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.read())
        return httpx.Response(204)

    discovery = Discovery(gateway, "http://control:1", transport=httpx.MockTransport(answer))
    discovery.apply([model("chat", "a")])
    router = gateway.routers["chat"]
    router.health.report_success("a")
    held = await router.acquire({})
    await discovery.report_once()
    router.finish(held)
    await discovery.aclose()
    body = json.loads(sent[0])
    assert body["models"] == [
        {
            "name": "chat",
            "in_flight": 1,
            "queued": 0,
            "oldest_wait_s": 0.0,
            "idle_s": 0.0,  # a request in flight
            "ready": 1,
            "instances": {"a": 1},
            "ready_ids": ["a"],
        }
    ]


async def test_a_deployments_requests_are_held_while_none_of_its_instances_is_ready(
    gateway: Gateway,
) -> None:
    assert gateway.discovery is not None
    gateway.discovery.apply([{**model("chat"), "hold": True, "hold_s": 20.0}])
    assert gateway.routers["chat"].hold_s == 20.0
    # not autoscaled: held while the control plane replaces them, up to the queue's timeout
    gateway.discovery.apply([{**model("chat"), "hold": True}])
    assert gateway.routers["chat"].hold_s == gateway.settings.gateway.queue.timeout_s
    # being deleted: nothing will replace them, refused at once
    gateway.discovery.apply([{**model("chat"), "hold": False, "hold_s": 20.0}])
    assert gateway.routers["chat"].hold_s is None
    gateway.discovery.apply([{**model("chat"), "hold": True, "hold_s": 20.0}])
    gateway.discovery.apply([])  # deleted: nothing comes for it any more
    assert gateway.routers["chat"].hold_s is None
