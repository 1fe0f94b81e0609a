"""The API's and the console's edge: a caller is identified and authorised before its body is
read, and a body past its configured limit is answered 413 naming the limit, however it is sent
(announced, chunked, or under a lying Content-Length). Each test counts the chunks the app pulled
from the client, through httpx's ASGI transport (the app in-process, as a server would run it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from gpuplane.control.identity.auth import Role
from gpuplane.control.identity.config import HttpConfig
from gpuplane.control.service.service import ControlService
from gpuplane.plane import control_app
from tests.control.svc_helpers import admin_token, config, make_service

pytestmark = pytest.mark.anyio

LIMIT = 64 << 10
FORM_LIMIT = 1024
CHUNK = 16 << 10
CHUNKS = 256  # 4 MiB offered: 64 times the limit


class Offered:
    """A large body sent a chunk at a time; `pulled` counts the chunks the server asked for."""

    def __init__(self, chunks: int = CHUNKS, chunk: bytes = b"x" * CHUNK) -> None:
        self.chunks, self.chunk, self.pulled = chunks, chunk, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.pulled += 1
            yield self.chunk

    @property
    def size(self) -> int:
        return self.chunks * len(self.chunk)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    http = HttpConfig(max_body_bytes=LIMIT, max_form_bytes=FORM_LIMIT)
    svc = make_service(config(str(tmp_path)).model_copy(update={"http": http}))
    yield svc
    svc.close()


def client(service: ControlService) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=control_app(service, background=False))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_an_anonymous_large_post_is_refused_before_a_byte_of_it_is_read(
    service: ControlService,
) -> None:
    async with client(service) as http:
        for url, auth in (("/jobs", {}), ("/jobs", bearer("gpl_not-a-token"))):
            body = Offered()
            r = await http.post(url, content=body, headers=auth)
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert body.pulled == 0
        # the console's forms alike: to the login page, the body unread
        body = Offered()
        r = await http.post("/ui/jobs/any/cancel", content=body)
        assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
        assert body.pulled == 0


async def test_a_caller_without_the_role_is_refused_before_the_body_is_read(
    service: ControlService,
) -> None:
    _, viewer = service.tokens.create("v", Role.viewer, "research")
    async with client(service) as http:
        body = Offered()
        r = await http.post("/jobs", content=body, headers=bearer(viewer))
        assert r.status_code == 403
        assert body.pulled == 0


@pytest.mark.parametrize("sent", ["announced", "chunked", "lying"])
async def test_a_body_past_the_limit_is_413_naming_it_and_is_not_read_whole(
    service: ControlService, sent: str
) -> None:
    body = Offered()
    headers = bearer(admin_token(service))
    if sent == "announced":
        headers["content-length"] = str(body.size)
    elif sent == "lying":
        headers["content-length"] = "100"  # and sends 4 MiB
    async with client(service) as http:
        r = await http.post("/jobs", content=body, headers=headers)
    assert r.status_code == 413
    assert r.headers["connection"] == "close"
    detail = r.json()["detail"]
    assert f"larger than {LIMIT} bytes" in detail
    assert "control.http.max_body_bytes" in detail
    # announced: nothing read; otherwise cut at the first chunk past the limit
    assert body.pulled == (0 if sent == "announced" else LIMIT // CHUNK + 1)


async def test_a_console_form_past_its_limit_is_413_on_a_page(service: ControlService) -> None:
    body = Offered(chunk=b"t" * 256)
    async with client(service) as http:
        r = await http.post(
            "/ui/login",
            content=body,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
    assert r.status_code == 413
    assert r.headers["content-type"].startswith("text/html")
    assert f"larger than {FORM_LIMIT} bytes" in r.text
    assert "control.http.max_form_bytes" in r.text
    assert body.pulled == FORM_LIMIT // 256 + 1


async def test_a_body_within_the_limit_reaches_the_handler_whole(
    service: ControlService,
) -> None:
    spec = {"name": "fits", "team": "research", "command": ["true"], "resources": {"gpus": 1}}
    async with client(service) as http:
        r = await http.post("/jobs?dry_run=true", json=spec, headers=bearer(admin_token(service)))
        assert r.status_code == 200, r.text
        assert r.json()["fits"] is True
