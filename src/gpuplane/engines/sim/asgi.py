"""The ASGI plumbing the simulator's handlers share: read a body, wait for the client to leave,
send a whole body or one chunk, and drop the connection the way a crashing engine does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

Scope = dict[str, Any]
Receive = Any
Send = Any

_JSON = [(b"content-type", b"application/json")]


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    return b"".join(chunks)


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def send_chunk(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def drop(send: Send) -> bool:
    """Close the connection mid-response, as an engine that crashes on this request does."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise ConnectionAbortedError("simulated drop")  # the server closes the connection
    transport.abort()
    await asyncio.sleep(0)  # connection_lost runs before the handler returns to uvicorn
    return False


async def send_json(send: Send, status: int, obj: object) -> None:
    await send_full(send, status, json.dumps(obj).encode())


async def send_full(send: Send, status: int, body: bytes) -> None:
    """A whole JSON body with its length (no chunked encoding: cheaper for every client)."""
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
