"""Traffic per model and instance from the gateway: requests, tokens and slot-seconds.

The edge (`GatewayReader`) reads three things: the gateway's `/admin/state` (every instance with
its model, URL and slots in flight), the gateway's `/metrics`
(`gpuplane_instance_requests_total{model, instance}`: slot grants per instance), and each
instance's engine metrics page for its token counters (vLLM, SGLang, LMDeploy, llama.cpp and the
simulator name them differently: `TOKEN_COUNTERS`; an engine without them leaves tokens null).

Slot occupancy is sampled: `sample()` reads the slots in flight (the CLI does it every second)
and adds the trapezoid since the last reading, so `slot_seconds` is exact to the sampling step.
The pure part (`traffic`) turns two counter readings and those slot-seconds into one row per
instance; a counter that went down (a restarted gateway or engine) counts from zero.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.audit.collect import CollectError
from gpuplane.audit.samples import TRAFFIC_SCHEMA, Traffic, to_table
from gpuplane.engines.base import prometheus_samples

REQUESTS = "gpuplane_instance_requests_total"
TOKEN_COUNTERS = {
    "prompt": (
        "vllm:prompt_tokens_total",
        "sglang:prompt_tokens_total",
        "lmdeploy:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
    ),
    "completion": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "lmdeploy:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
    ),
}

# (model, instance id)
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Counts:
    """Cumulative counters of one instance at one reading."""

    requests: float = 0.0
    prompt_tokens: float | None = None
    completion_tokens: float | None = None


def traffic(
    now: datetime,
    before: Mapping[Key, Counts],
    after: Mapping[Key, Counts],
    slot_seconds: Mapping[Key, float],
) -> pa.Table:
    """One traffic row per instance known at the second reading, for the time between them."""
    rows = []
    for key in sorted(set(after) | set(slot_seconds)):
        a, b = after.get(key, Counts()), before.get(key, Counts())
        prompt = _delta(b.prompt_tokens, a.prompt_tokens)
        completion = _delta(b.completion_tokens, a.completion_tokens)
        rows.append(
            Traffic(
                time=now,
                model=key[0],
                instance=key[1],
                requests=int(_delta(b.requests, a.requests) or 0),
                prompt_tokens=None if prompt is None else int(prompt),
                completion_tokens=None if completion is None else int(completion),
                slot_seconds=slot_seconds.get(key, 0.0),
            )
        )
    return to_table(rows) if rows else TRAFFIC_SCHEMA.empty_table()


def _delta(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    if before is None or after < before:  # new, or restarted: it counted from zero
        return after
    return after - before


class GatewayReader:
    """The I/O edge, over one gateway. `sample()` often; `read()` once per pass."""

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 10.0,
        admin_key: str | None = None,
    ) -> None:
        """`client`: the gateway's client (tests pass one over the app in-process);
        `admin_key`: sent to the gateway's admin routes, which need one once it has keys."""
        self.url = url.rstrip("/")
        self._gateway = client or httpx.AsyncClient(timeout=timeout_s)
        if admin_key:
            self._gateway.headers["authorization"] = f"Bearer {admin_key}"
        self._engines = httpx.AsyncClient(timeout=timeout_s)
        self._last: tuple[float, dict[Key, int]] | None = None
        self._slot_seconds: dict[Key, float] = {}
        self._urls: dict[Key, str] = {}

    async def sample(self, now: float) -> None:
        """Read the slots in flight; add the slot-seconds since the last sample."""
        state = await self._get_json("/admin/state")
        flight = {}
        for inst in state.get("instances", []):
            key = (str(inst["model"]), str(inst["id"]))
            flight[key] = int(inst["in_flight"])
            self._urls[key] = str(inst["url"])
        if self._last is not None:
            then, before = self._last
            for key in flight.keys() | before.keys():
                area = (before.get(key, 0) + flight.get(key, 0)) / 2 * (now - then)
                self._slot_seconds[key] = self._slot_seconds.get(key, 0.0) + area
        self._last = (now, flight)

    def take_slot_seconds(self) -> dict[Key, float]:
        """The slot-seconds sampled since the last call."""
        out, self._slot_seconds = self._slot_seconds, {}
        return out

    async def read(self) -> dict[Key, Counts]:
        """Every instance's cumulative requests (the gateway's) and tokens (its engine's)."""
        text = await self._get_text(self.url + "/metrics", "the gateway's metrics")
        requests: dict[Key, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == REQUESTS:
                    requests[(s.labels["model"], s.labels["instance"])] = s.value
        out = {}
        for key, url in self._urls.items():
            tokens = await self._tokens(url)
            out[key] = Counts(
                requests.get(key, 0.0), tokens.get("prompt"), tokens.get("completion")
            )
        return out

    async def _tokens(self, url: str) -> dict[str, float]:
        try:
            response = await self._engines.get(url.rstrip("/") + "/metrics")
            values = prometheus_samples(response.text) if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            values = {}  # an engine down or without a metrics page: its tokens are unknown
        out = {}
        for kind, names in TOKEN_COUNTERS.items():
            # one engine's spelling of the counter (the simulator writes several, all equal)
            found = next((values[n] for n in names if n in values), None)
            if found is not None:
                out[kind] = found
        return out

    async def _get_text(self, url: str, what: str) -> str:
        try:
            response = await self._gateway.get(url)
        except httpx.HTTPError as exc:
            raise CollectError(
                f"cannot reach the gateway at {self.url}: {exc}; check --url"
            ) from None
        if response.status_code == 401:
            raise CollectError(
                f"{what} at {url} needs the gateway's admin key: set $GPUPLANE_ADMIN_KEY "
                "(or pass --admin-key @FILE)"
            )
        if response.status_code != 200:
            raise CollectError(
                f"{what} at {url} answered {response.status_code}; "
                f"is {self.url} a gpuplane gateway?"
            )
        return response.text

    async def _get_json(self, path: str) -> dict[str, Any]:
        text = await self._get_text(self.url + path, path)
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise CollectError(f"{self.url}{path} is not the gateway's JSON state")
        return body

    async def aclose(self) -> None:
        await self._gateway.aclose()
        await self._engines.aclose()
