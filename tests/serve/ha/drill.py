"""The primary/standby drill harness: two real gateway processes (`gpuplane gateway serve
--config ...`) in front of simulated engines in a child process, a streaming load, and the
engines' own `max_running_seen` as the ground truth. The drill tests and
`benchmarks/gateway_ha.py` both run on it.

The client's contract (what "0 failed requests" assumes): like a load balancer that checks
`/readyz` every 0.1 s (0.5 s timeout), it sends a request only to a gateway whose last check
answered 200, and holds it while none does; a request that gets a 503 with `Retry-After`, or
whose connection is refused before any answer, is sent again (after `retry_pause_s`) until its
deadline; a request that got a 200 is never sent again. A stream cut after its first byte,
any other status, or the deadline passing counts as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpuplane.engines.sim import SimProcess, sim_process
from tests.helpers.common import free_port

CAPACITY = 4  # the gateway's slots per instance; the engines would run 16, so more would show


@dataclass(slots=True)
class Outcome:
    sent_at: float
    done_at: float = 0.0
    served_by: str | None = None  # the gateway that answered 200
    first_byte_at: float | None = None
    failed: str | None = None
    retries: int = 0


@dataclass
class GatewayProc:
    name: str
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [sys.executable, "-m", "gpuplane.cli.main", "gateway", "serve"]
        argv += ["--config", str(self.config), "--port", str(self.port)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Drill:
    sim: SimProcess
    gateways: list[GatewayProc]
    client: httpx.AsyncClient
    deadline_s: float = 15.0
    retry_pause_s: float = 0.05
    outcomes: list[Outcome] = field(default_factory=list)
    max_tokens: int = 8
    passing: list[GatewayProc] = field(default_factory=list)  # what the last checks passed

    async def watch(self) -> None:
        """The load balancer's health check of every gateway's /readyz."""

        async def check(gw: GatewayProc) -> bool:
            try:
                resp = await self.client.get(gw.url + "/readyz", timeout=0.5)
            except httpx.HTTPError:
                return False
            return resp.status_code == 200

        while True:
            ok = await asyncio.gather(*(check(gw) for gw in self.gateways))
            self.passing = [gw for gw, up in zip(self.gateways, ok, strict=True) if up]
            await asyncio.sleep(0.1)

    async def state(self, gw: GatewayProc) -> dict[str, Any] | None:
        try:
            resp = await self.client.get(gw.url + "/admin/state", timeout=2.0)
            return dict(resp.json())
        except (httpx.HTTPError, ValueError):
            return None

    async def leader(self, timeout_s: float = 30.0) -> GatewayProc:
        """The gateway whose /readyz answers 200 (waits for one)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for gw in self.gateways:
                try:
                    if (await self.client.get(gw.url + "/readyz", timeout=1.0)).status_code == 200:
                        return gw
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"no gateway became ready within {timeout_s:g} s")

    async def ready(self, gw: GatewayProc, timeout_s: float = 30.0) -> None:
        """Wait until `gw` answers at all (a standby answers /readyz 503)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if await self.state(gw) is not None:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"gateway {gw.name} did not start; see {gw.log}")

    async def request(self) -> Outcome:
        """One streamed completion under the client contract above."""
        out = Outcome(time.monotonic())
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": f"drill {len(self.outcomes)}"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        self.outcomes.append(out)
        i = len(self.outcomes)
        while time.monotonic() - out.sent_at < self.deadline_s:
            if not self.passing:  # the balancer holds requests while no gateway is ready
                await asyncio.sleep(self.retry_pause_s)
                continue
            gw = self.passing[i % len(self.passing)]
            i += 1
            try:
                async with self.client.stream(
                    "POST", gw.url + "/v1/chat/completions", json=body
                ) as resp:
                    if resp.status_code == 503 and "retry-after" in resp.headers:
                        await resp.aread()
                        out.retries += 1
                        await asyncio.sleep(self.retry_pause_s)
                        continue
                    if resp.status_code != 200:
                        out.failed = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                        break
                    out.first_byte_at = time.monotonic()
                    out.served_by = gw.name
                    text = b"".join([chunk async for chunk in resp.aiter_bytes()])
                    if b"[DONE]" not in text or b'"error"' in text:
                        out.failed = f"stream broke: {text[-200:]!r}"
                    break
            except httpx.ConnectError:
                out.retries += 1
                await asyncio.sleep(self.retry_pause_s)
            except httpx.HTTPError as exc:
                if out.first_byte_at is not None:
                    out.failed = f"stream cut: {exc!r}"
                    break
                out.retries += 1  # refused mid-connect (a killed gateway): nothing ran
                await asyncio.sleep(self.retry_pause_s)
        else:
            out.failed = f"no answer within {self.deadline_s:g} s"
        out.done_at = time.monotonic()
        return out

    async def load(
        self, rate: float, seconds: float, stop: asyncio.Event | None = None
    ) -> list[Outcome]:
        """Open-loop arrivals at `rate` per second for `seconds` (or until `stop` is set),
        spread over both gateways."""
        tasks = []
        start = time.monotonic()
        n = int(rate * seconds)
        for k in range(n):
            if stop is not None and stop.is_set():
                break
            await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))
            tasks.append(asyncio.create_task(self.request()))
        return list(await asyncio.gather(*tasks))

    async def max_running(self) -> list[int]:
        return [int(s["max_running_seen"]) for s in await self.sim.stats()]


def write_config(path: Path, urls: list[str], ha: dict[str, Any]) -> None:
    models = [
        {
            "name": "m",
            "engine": "sim",
            "instances": [{"url": u, "max_concurrency": CAPACITY} for u in urls],
        }
    ]
    cfg = {
        "gateway": {"host": "127.0.0.1", "ha": {"mode": "primary_standby", **ha}},
        "models": models,
    }
    path.write_text(json.dumps(cfg))  # JSON is YAML


@asynccontextmanager
async def drill(
    tmp: Path, instances: int = 2, ha: dict[str, Any] | None = None, itl_ms: float = 20.0
) -> AsyncIterator[Drill]:
    """The sim engines and two gateways (a first, so it leads) for the block."""
    ha = ha or {"lease": "file", "path": str(tmp / "gateway.lease")}
    async with sim_process(instances, 16, seed=5, itl_ms=itl_ms) as sim:
        gateways = []
        for name in ("a", "b"):
            config = tmp / f"gateway-{name}.yaml"
            write_config(config, sim.urls, {**ha, "gateway_id": name})
            gateways.append(GatewayProc(name, free_port(), config, tmp / f"gateway-{name}.log"))
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
            d = Drill(sim, gateways, client)
            watch = asyncio.create_task(d.watch())
            try:
                gateways[0].start()
                await d.leader()
                gateways[1].start()
                await d.ready(gateways[1])
                yield d
            finally:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
                for gw in gateways:
                    gw.stop()
