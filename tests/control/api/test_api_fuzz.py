"""schemathesis over the control API's OpenAPI document, as an admin and as a member of a team:
whatever the document allows a client to send, the API never answers with a server error, and
every answer it documents matches its documented schema.

The real app over a real SQLite store; the service binds nothing (no job a fuzzed spec
describes is ever started) and the examples per operation are bounded, so the run stays within
a few minutes on 2 cores. What the document does not allow (schemathesis' negative mode) is
answered 4xx, never 5xx.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode

from gpuplane.control.identity.auth import POLICY, Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import TeamConfig
from gpuplane.plane import control_app
from tests.control.svc_helpers import admin_token, config, job
from tests.fuzzing import CHECKS, bounded

EXAMPLES = 15
DOC_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


@pytest.fixture
def unbound(tmp_path: Path) -> Iterator[ControlService]:
    """A service that starts nothing it admits, with one queued job for the routes taking one."""
    teams = (TeamConfig(name="research"), TeamConfig(name="vision"))
    svc = ControlService(config(str(tmp_path), teams=teams), bind_on_submit=False)
    svc.start()
    svc.submit(job("seed"))
    yield svc
    svc.close()


# every route of the OpenAPI document: the policy table's, less the docs FastAPI serves itself
# and the web console's pages (not in the document; tests/control/test_console.py has them)
ROUTES = sorted(r for r, rule in POLICY.items() if r[1] not in DOC_PATHS and not rule.console)


def token_of(service: ControlService, role: str) -> str:
    """The admin token, or a new member token of team research (which owns the seeded job)."""
    if role == "admin":
        return admin_token(service)
    return service.tokens.create("fuzz", Role.member, "research")[1]


# what the document allows, as each role; and, as an admin, what it does not (wrong types,
# missing fields, values out of range): a 4xx, never a 5xx
CASES = [(route, role, GenerationMode.POSITIVE) for route in ROUTES for role in ("admin", "member")]
CASES += [(route, "admin", GenerationMode.NEGATIVE) for route in ROUTES]


def case_id(value: object) -> str:
    if isinstance(value, tuple):
        return " ".join(value)
    return value.value if isinstance(value, GenerationMode) else str(value)


@pytest.mark.slow
@pytest.mark.parametrize(("route", "role", "mode"), CASES, ids=case_id)
def test_no_request_gives_a_server_error_or_an_answer_off_the_document(
    unbound: ControlService, route: tuple[str, str], role: str, mode: GenerationMode
) -> None:
    app = control_app(unbound, background=False)
    loopback = {"host": "127.0.0.1"}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=loopback)
    operation = schema[route[1]][route[0]]
    headers = {"authorization": f"Bearer {token_of(unbound, role)}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @bounded(EXAMPLES)
    def check(case: schemathesis.Case[Any]) -> None:
        response = case.call(base_url="http://127.0.0.1", headers=headers)
        case.validate_response(response, checks=CHECKS)

    check()
