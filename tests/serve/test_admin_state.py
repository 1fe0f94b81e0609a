"""`/admin/state`: every instance once, with its model and state; each model's queue."""

from __future__ import annotations

import pytest

from tests.helpers.serve import SEGV, asgi_gateway, one_of_each_state

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]

INSTANCE_KEYS = {
    "model", "id", "url", "state", "in_flight", "capacity", "last_error", "prefix_cache"
}  # fmt: skip


async def test_admin_state_lists_each_instance_once_with_its_model_and_state() -> None:
    async with asgi_gateway(instances=3) as (client, gw):
        one_of_each_state(gw)
        state = (await client.get("/admin/state")).json()
    assert set(state) == {"instances", "models"}
    instances = state["instances"]
    assert [set(i) for i in instances] == [INSTANCE_KEYS] * 3
    assert [(i["model"], i["state"]) for i in instances] == [
        ("m", "unhealthy"),
        ("m", "ready"),
        ("m", "crash_looping"),
    ]
    assert [(i["in_flight"], i["capacity"]) for i in instances] == [(0, 2)] * 3
    # why each went down: a request's failure, or its engine's last exit
    assert [i["last_error"] for i in instances] == [
        "1 failure(s) in a row, the last (connect): refused",
        None,
        SEGV,
    ]
    assert state["models"] == [
        {"name": "m", "queued": 0, "queued_by_tenant": {}, "stream_usage": "engine"}
    ]
