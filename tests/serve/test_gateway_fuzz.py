"""schemathesis over the gateway's OpenAPI document (`GET /openapi.json`), against the gateway
served over HTTP in front of two simulated engines: whatever the document allows a client to
send to any route, the gateway never answers with a server error, and every answer it documents
matches its documented schema; a body the document allows is never refused by the gateway's
own checks (the document is built from them); and what it does not allow is a 4xx.

A tenant's key on the OpenAI routes, the admin key on /admin/* and /metrics. The engines refuse,
as vLLM does, a prompt plus max_tokens past their context (4,096 tokens), so a fuzzed max_tokens
is an engine's 400, not a generation without end. Bounded: a few examples per route.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode

from gpuplane.config import parse_settings
from gpuplane.engines.sim import start_sim
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.openapi import document
from gpuplane.serve.server import serving
from gpuplane.serve.settings import key_digest
from tests.fuzzing import CHECKS, bounded
from tests.helpers.common import gateway_settings

pytestmark = pytest.mark.slow

EXAMPLES = 40
# the gateway's own refusals of a body (`validation.py`); an engine's 400 has the engine's code
OWN_REFUSALS = ("invalid_request", "invalid_json")
TENANT = {"authorization": "Bearer tenant-key"}
ADMIN = {"authorization": "Bearer admin-key"}


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    """The gateway over HTTP on a loop of its own thread, in front of two simulated engines
    (capacity 4, no token delay), with one tenant key and an admin key."""
    started: list[str] = []
    ready, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with start_sim(2, 4, seed=1, itl_ms=0.0, max_model_len=4096) as fleet:
            instances = [{"url": u, "max_concurrency": 4} for u in fleet.urls]
            config = gateway_settings(
                [{"name": "m", "engine": "sim", "instances": instances}],
                admin={"key_sha256": [key_digest("admin-key")]},
            )
            config["tenants"] = [{"name": "fuzz", "key_sha256": [key_digest("tenant-key")]}]
            async with serving(parse_settings(config), Gateway(parse_settings(config))) as url:
                started.append(url)
                ready.set()
                await asyncio.to_thread(stop.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="fuzzed-gateway")
    thread.start()
    try:
        assert ready.wait(60), "the gateway did not start within 60 s"
        yield started[0]
    finally:
        stop.set()
        thread.join(60)


def has_fraction(value: object) -> bool:
    """Whether `value` holds an integer written as 1.0, which JSON Schema's integer takes and
    the gateway refuses (the document says so in words)."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, list):
        return any(has_fraction(v) for v in value)
    return False


def served_model(case: schemathesis.Case[Any]) -> schemathesis.Case[Any]:
    """The case with its body's model the one served: the request reaches an engine."""
    if isinstance(case.body, dict):
        case.body["model"] = "m"
    return case


ROUTES = sorted((m.upper(), p) for p, item in document()["paths"].items() for m in item)
# what the document allows, and (routes with a body) what it does not: a 4xx, never a 5xx
CASES = [(r, GenerationMode.POSITIVE) for r in ROUTES] + [
    (r, GenerationMode.NEGATIVE) for r in ROUTES if r[0] == "POST"
]


@pytest.mark.parametrize(
    ("route", "mode"),
    CASES,
    ids=lambda c: c.value if isinstance(c, GenerationMode) else " ".join(c),
)
def test_no_request_to_the_gateway_gives_a_server_error_or_an_answer_off_its_document(
    gateway_url: str, route: tuple[str, str], mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(gateway_url + "/openapi.json")
    operation = schema[route[1]][route[0]]
    headers = ADMIN if route[1].startswith(("/admin", "/metrics")) else TENANT
    seen: list[int] = []

    strategy = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE and route[0] == "POST":
        strategy = strategy.map(served_model)  # else nearly every body names an unknown model

    @given(case=strategy)
    @bounded(EXAMPLES)
    def check(case: schemathesis.Case[Any]) -> None:
        response = case.call(headers=headers, timeout=30)
        seen.append(response.status_code)
        case.validate_response(response, checks=CHECKS)
        if mode is GenerationMode.POSITIVE and response.status_code == 400:
            error = response.json()["error"]
            if error["code"] in OWN_REFUSALS:
                sent = case.body if isinstance(case.body, dict) else {}
                field = sent.get(str(error["param"]).split(".")[0])
                assert has_fraction(field), f"allowed by the document: {error}"

    check()
    if mode is GenerationMode.POSITIVE:  # the pass reached the route's own answer
        assert 200 in seen, f"no request the document allows was answered 200: {set(seen)}"
