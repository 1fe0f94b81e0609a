"""schemathesis over the control API's OpenAPI document, as an admin: whatever the document
allows a client to send, the API never answers with a server error.

The service binds nothing (no job a fuzzed spec describes is ever started) and the examples per
operation are bounded, so the run stays within a minute or two.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from gpuplane.control.api import create_app
from gpuplane.control.auth import POLICY
from gpuplane.control.service import ControlService
from gpuplane.control.settings import TeamConfig
from tests.control.svc_helpers import admin_token, config, job

EXAMPLES = 25
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


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0]} {r[1]}")
def test_no_request_the_openapi_document_allows_gives_a_server_error(
    unbound: ControlService, route: tuple[str, str]
) -> None:
    app = create_app(unbound, background=False)
    loopback = {"host": "127.0.0.1"}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=loopback)
    operation = schema[route[1]][route[0]]
    headers = {"authorization": f"Bearer {admin_token(unbound)}"}

    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: schemathesis.Case[Any]) -> None:
        response = case.call(base_url="http://127.0.0.1", headers=headers)
        case.validate_response(response, checks=[not_a_server_error])

    check()
