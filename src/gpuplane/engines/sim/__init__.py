"""The simulated engine: fixture API (`start_sim`, `sim_process`) and the `sim` engine adapter.

The simulator itself is `server.py` (the fleet: sockets, routes, control) and `instance.py` (one
instance serving a completion) over the pure `model.py` (the behaviour), with `wire.py` (OpenAI
bodies) and `metrics.py` (vLLM-named `/metrics`). `start_sim` runs K instances in the caller's
event loop, which is what pytest fixtures want; `sim_process` runs them in a child process
(`gpuplane engine sim`), which is what benchmarks want so that the simulator does not share a
core with what it measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx

from gpuplane.engines.base import EngineAdapter, EngineLoad, LaunchSpec, register
from gpuplane.engines.sim.model import SimParams
from gpuplane.engines.sim.server import SimFleet
from gpuplane.engines.vllm import parse_vllm_load
from gpuplane.resources import Slice

__all__ = ["SimAdapter", "SimFleet", "SimProcess", "fleet_params", "sim_process", "start_sim"]


def fleet_params(
    instances: int,
    max_num_seqs: int | Sequence[int],
    slowdown: dict[int, float] | None = None,
    **opts: Any,
) -> list[SimParams]:
    """Per-instance parameters: capacities cycle through `max_num_seqs`; `slowdown` by index."""
    caps = [max_num_seqs] if isinstance(max_num_seqs, int) else list(max_num_seqs)
    if instances < 1 or not caps:
        raise ValueError("need at least one instance and one max_num_seqs value")
    base = SimParams(max_num_seqs=caps[0], **opts)
    slow = slowdown or {}
    return [
        replace(base, max_num_seqs=caps[i % len(caps)], slowdown=slow.get(i, base.slowdown))
        for i in range(instances)
    ]


@asynccontextmanager
async def start_sim(
    instances: int = 1,
    max_num_seqs: int | Sequence[int] = 4,
    seed: int = 0,
    *,
    host: str = "127.0.0.1",
    base_port: int = 0,
    model: str = "sim",
    slowdown: dict[int, float] | None = None,
    **opts: Any,
) -> AsyncIterator[SimFleet]:
    """Run simulated instances in this event loop for the block; free ports unless `base_port`.

    `opts` are `SimParams` fields (itl_ms, prefill_tokens_per_s, error_rate, zero_delay, ...).
    """
    fleet = SimFleet(
        fleet_params(instances, max_num_seqs, slowdown, **opts),
        seed=seed,
        host=host,
        base_port=base_port,
        model=model,
    )
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()


@dataclass(slots=True)
class SimProcess:
    """Simulated instances in a child process, controlled over HTTP (`/sim/...`)."""

    urls: list[str]
    proc: asyncio.subprocess.Process
    client: httpx.AsyncClient

    async def stats(self) -> list[dict[str, Any]]:
        resp = await self._control("GET", "/sim/stats/all", avoid=None)
        return list(resp.json()["instances"])

    async def kill(self, i: int) -> None:
        await self._control("POST", f"/sim/instances/{i}/kill", avoid=i)

    async def restart(self, i: int) -> None:
        await self._control("POST", f"/sim/instances/{i}/restart", avoid=i)

    async def hang(self, i: int, hung: bool = True) -> None:
        verb = "hang" if hung else "unhang"
        await self._control("POST", f"/sim/instances/{i}/{verb}", avoid=i)

    async def _control(self, method: str, path: str, avoid: int | None) -> httpx.Response:
        """Ask any live instance (the one acted on last, since it may be down)."""
        order = [j for j in range(len(self.urls)) if j != avoid] + (
            [avoid] if avoid is not None else []
        )
        last: Exception | None = None
        for j in order:
            try:
                resp = await self.client.request(method, self.urls[j] + path)
                resp.raise_for_status()
                return resp
            except httpx.HTTPError as exc:
                last = exc
        raise RuntimeError(f"no simulated instance answered {method} {path}: {last}")


def sim_argv(
    instances: int,
    max_num_seqs: int | Sequence[int],
    seed: int = 0,
    *,
    base_port: int = 0,
    model: str = "sim",
    slowdown: dict[int, float] | None = None,
    **opts: Any,
) -> list[str]:
    """The `gpuplane engine sim` command line for these options (SimParams fields as flags)."""
    caps = [max_num_seqs] if isinstance(max_num_seqs, int) else list(max_num_seqs)
    argv = [sys.executable, "-m", "gpuplane.cli.main", "engine", "sim", "-o", "json"]
    argv += ["--instances", str(instances), "--max-num-seqs", ",".join(map(str, caps))]
    argv += ["--seed", str(seed), "--base-port", str(base_port), "--model", model]
    for index, factor in (slowdown or {}).items():
        argv += ["--slow", f"{index}={factor}"]
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv


@asynccontextmanager
async def sim_process(
    instances: int = 1,
    max_num_seqs: int | Sequence[int] = 4,
    seed: int = 0,
    *,
    ready_timeout_s: float = 30.0,
    **opts: Any,
) -> AsyncIterator[SimProcess]:
    """Run simulated instances in a child process for the block (same options as `start_sim`)."""
    argv = sim_argv(instances, max_num_seqs, seed, **opts)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), ready_timeout_s)
        except TimeoutError:
            line = b""
        if not line:
            err = (await proc.stderr.read()).decode(errors="replace") if proc.returncode else ""
            raise RuntimeError(f"the simulator did not start: {' '.join(argv)}\n{err}")
        urls = list(json.loads(line)["urls"])
        async with httpx.AsyncClient(timeout=10.0) as client:
            yield SimProcess(urls=urls, proc=proc, client=client)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@register
class SimAdapter(EngineAdapter):
    """The simulator: launched as `gpuplane engine sim`, vLLM-format metrics, sglang-style info."""

    name = "sim"
    default_capacity = 4
    info_path = "/server_info"

    def launch(
        self, model_path: str, host: str, port: int, slice_: Slice, capacity: int | None
    ) -> LaunchSpec:
        argv = ["gpuplane", "engine", "sim", "--host", host, "--base-port", str(port)]
        argv += ["--instances", "1", "--model", model_path]
        if capacity is not None:
            argv += ["--max-num-seqs", str(capacity)]
        return LaunchSpec(argv=argv, env={})

    def parse_load(self, metrics_text: str) -> EngineLoad:
        return parse_vllm_load(metrics_text)

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        value = info.get("max_running_requests")
        return value if isinstance(value, int) and value > 0 else None
