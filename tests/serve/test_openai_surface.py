"""What an OpenAI client meets at the gateway's edges: routes it does not serve, request fields it
refuses, and an engine's own refusal of a request, each in the OpenAI error shape."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.serve import asgi_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/audio/transcriptions"),
        ("POST", "/v1/images/generations"),
        ("GET", "/v1/files"),
        ("POST", "/v1/batches"),
        ("POST", "/v1/moderations"),
        ("POST", "/v1/fine_tuning/jobs"),
        ("POST", "/v1/assistants"),
        ("POST", "/v1/threads"),
        ("GET", "/v1/no-such-thing"),
    ],
)
async def test_an_endpoint_the_gateway_does_not_serve_is_an_openai_error(
    method: str, path: str
) -> None:
    async with asgi_gateway() as (client, _):
        r = await client.request(method, path, json={"model": "m", "input": "x"})
    assert r.status_code == 404
    err = error_of(r)
    assert err["code"] == "unsupported_endpoint"
    assert err["type"] == "invalid_request_error"
    assert f"does not serve {method} {path}" in err["message"]
    for served in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"):
        assert served in err["message"]


async def test_a_wrong_method_on_a_served_route_is_an_openai_405() -> None:
    async with asgi_gateway() as (client, _):
        r = await client.post("/v1/models", json={})
    assert r.status_code == 405
    assert "GET" in r.headers["allow"]
    err = error_of(r)
    assert err["code"] == "method_not_allowed"
    assert "/v1/models only accepts GET" in err["message"]


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"model": 3}, "model", "non-empty string"),
        ({"max_tokens": 0}, "max_tokens", "integer of at least 1, not 0"),
        ({"max_tokens": "8"}, "max_tokens", 'not "8"'),
        ({"max_tokens": True}, "max_tokens", "not true"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "at least 1"),
        ({"temperature": 2.5}, "temperature", "a number from 0 to 2, not 2.5"),
        ({"temperature": "hot"}, "temperature", "from 0 to 2"),
        ({"top_p": 1.5}, "top_p", "a number from 0 to 1"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"n": 0}, "n", "an integer from 1 to 128"),
        ({"n": 129}, "n", "from 1 to 128"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 strings"),
        ({"stop": 7}, "stop", "a string or a list"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"content": "hi"}]}, "messages.0", "string role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "string"),
    ],
)
async def test_a_field_out_of_range_is_refused_with_its_param(
    fields: dict[str, Any], param: str, needle: str
) -> None:
    async with asgi_gateway() as (client, gw):
        r = await client.post("/v1/chat/completions", json={**CHAT, **fields})
        assert gw.routers["m"].slots.in_flight == 0
    assert r.status_code == 400
    err = error_of(r)
    assert (err["code"], err["param"]) == ("invalid_request", param)
    assert needle in err["message"]


@pytest.mark.parametrize(
    ("prompt", "ok"),
    [("x", True), (["x", "y"], True), ([1, 2], True), ([[1], [2, 3]], True), (7, False)],
)
async def test_prompt_types(prompt: Any, ok: bool) -> None:
    async with asgi_gateway() as (client, _):
        r = await client.post("/v1/completions", json={"model": "m", "prompt": prompt})
    if ok:
        assert r.status_code == 200
    else:
        assert r.status_code == 400
        assert error_of(r)["param"] == "prompt"


async def test_fields_in_range_and_nulls_go_through() -> None:
    body = {**CHAT, "temperature": 0, "top_p": 1, "n": 2, "stop": ["\n"], "stream": None}
    async with asgi_gateway() as (client, _):
        r = await client.post("/v1/chat/completions", json={**body, "max_completion_tokens": 3})
    assert r.status_code == 200


async def test_an_engines_own_400_is_translated_and_not_an_instance_failure() -> None:
    """A prompt past the engine's context: the engine's message in the OpenAI shape, the status
    kept, tried once (not elsewhere), and the instance still ready."""
    long = {**CHAT, "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50}
    async with asgi_gateway(instances=2, max_model_len=64) as (client, _):
        for stream in (False, True):
            r = await client.post("/v1/chat/completions", json={**long, "stream": stream})
            assert r.status_code == 400
            assert r.headers["content-type"] == "application/json"
            err = error_of(r)
            assert err["code"] == "upstream_invalid_request"
            assert err["type"] == "invalid_request_error"
            assert "maximum context length is 64 tokens" in err["message"]
        state = (await client.get("/admin/state")).json()
        metrics = (await client.get("/metrics")).text
    assert [i["state"] for i in state["instances"]] == ["ready", "ready"]
    # no failure counted, no retry elsewhere (a tally shows no sample until it counts one)
    assert "gpuplane_upstream_failures_total{" not in metrics
    assert "gpuplane_retries_total{" not in metrics
