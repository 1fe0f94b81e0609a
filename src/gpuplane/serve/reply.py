"""The answer a proxied request sends its client, as it goes: its status (0 until it starts)
and whether it ended, which the client watcher, the retry decision and the settlement read."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.types import Send

from gpuplane.serve.errors import error_body

JSON_HEADER = (b"content-type", b"application/json")


class Reply:
    """One ASGI answer: `start` once, then body messages, `finish` with the last one."""

    __slots__ = ("finished", "send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0  # HTTP status sent to the client; 0 until the answer starts
        self.finished = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def error(
        self,
        status: int,
        message: str,
        code: str,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        """A whole error answer in OpenAI's shape (the answer must not have started)."""
        body = json.dumps(error_body(status, message, code)).encode()
        headers = [JSON_HEADER]
        headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
        await self.start(status, headers)
        await self.finish(body)

    async def finish(self, body: bytes) -> None:
        self.finished = True
        await self.send({"type": "http.response.body", "body": body})
