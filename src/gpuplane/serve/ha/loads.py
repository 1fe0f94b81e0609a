"""Each engine's own count of the requests it holds (running + waiting), from its metrics.

The truth both HA modes check themselves against: a takeover's rebuild counts what the previous
leader left running (`leadership.py`), and a shared gateway that lost Redis admits only once the
engines show that no other gateway can still hold more than its share (`shared.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

import httpx

from gpuplane.engines.base import EngineAdapter

Key = tuple[str, str]  # (model, instance id)
Instance = tuple[str, str, str]  # (model, instance id, url)


class LoadReader(Protocol):
    async def read(self, instances: Sequence[Instance]) -> dict[Key, int | None]:
        """Requests each instance's engine holds now; None where it does not say."""

    async def aclose(self) -> None: ...


class EngineLoads:
    """Reads the engines' metrics pages, all at once, each within `timeout_s`."""

    def __init__(self, adapters: Mapping[str, EngineAdapter], timeout_s: float = 1.0) -> None:
        self.adapters = adapters
        self._client = httpx.AsyncClient(timeout=timeout_s)

    async def read(self, instances: Sequence[Instance]) -> dict[Key, int | None]:
        loads = await asyncio.gather(*(self._load(model, url) for model, _, url in instances))
        return {(model, iid): n for (model, iid, _), n in zip(instances, loads, strict=True)}

    async def _load(self, model: str, url: str) -> int | None:
        adapter = self.adapters[model]
        try:
            resp = await self._client.get(url + adapter.metrics_path)
            resp.raise_for_status()
            load = adapter.parse_load(resp.text)
        except (httpx.HTTPError, ValueError):
            return None  # no answer, or no such metric: the callers count the worst case
        if load.running is None:
            return None
        return load.running + (load.waiting or 0)

    async def aclose(self) -> None:
        await self._client.aclose()
