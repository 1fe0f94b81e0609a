"""Real llama.cpp engines for tests: start N instances under the gpuplane supervisor."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpuplane.engines.config import EngineConfig
from gpuplane.engines.llamacpp import LlamaCpp, embedded_launches
from gpuplane.serve.supervisor import Supervisor
from tests.helpers.common import free_port


@asynccontextmanager
async def llama_instances(n: int, log_dir: Path) -> AsyncIterator[Supervisor]:
    """N embedded-default llama.cpp instances on free ports, as `gpuplane up` starts them."""
    launches = embedded_launches(EngineConfig(), [free_port() for _ in range(n)])
    supervisor = Supervisor(LlamaCpp(), launches, log_dir=log_dir, restart_backoff_s=0.2)
    await supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.stop()


@dataclass
class StreamResult:
    status: int
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    instance: str | None = None

    @property
    def complete(self) -> bool:
        return (
            self.status == 200 and self.done and self.finish_reason is not None and not self.error
        )


async def stream_chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> StreamResult:
    """POST a streaming chat request and read it to the end, tolerating a broken connection."""
    try:
        async with client.stream("POST", url, json=body, headers=headers or {}) as response:
            result = StreamResult(
                response.status_code, instance=response.headers.get("x-gpuplane-instance")
            )
            if response.status_code != 200:
                await response.aread()
                result.error = response.text
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    result.done = True
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    result.error = event["error"]["message"]
                    continue
                for choice in event.get("choices", []):
                    result.text += (choice.get("delta") or {}).get("content") or ""
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
            return result
    except httpx.HTTPError as exc:
        return StreamResult(0, error=f"{type(exc).__name__}: {exc}")


def chat_body(
    question: str, system: str | None = None, max_tokens: int = 24, **extra: Any
) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    return {
        "model": "smollm2",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        **extra,
    }
