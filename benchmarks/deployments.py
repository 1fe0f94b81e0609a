"""Deployments under load: rollouts, canary weights, autoscaling, scale-downs, drills, end to end.

One process tree on this machine: the control plane (`ControlService`, its API over HTTP with the
tick loop `control serve` runs, two local clusters of declared cards), a gateway that discovers the
deployment by watching it (`Gateway(control=URL)`, served over HTTP), and the simulated engines
(`gpuplane engine sim`, each one a job of the local adapter, a process of its own) that take
`--start-delay` seconds to start listening, as an engine loads its model. The load is a fixed
number of streaming clients (bounded); a request counts as answered only if its stream ends with
a `finish_reason` before `[DONE]`, as failed when its status is not 200 or its connection breaks,
and as truncated when it ends without one.

Scenarios (each figure is printed and written to benchmarks/results/deployments.json):
  rollout     v1 (2 instances) → canary v2 at 10 %, 50 %, then promoted (100 %, v1 drains),
              under streaming load: failed and truncated requests.
  weights     at 10 % and 50 %: the share of 1,000 requests that went to v2 (the gateway's
              `gpuplane_instance_requests_total`), one freshly seeded gateway per seed; error in
              points, median over the seeds.
  step        an autoscaled deployment (min 1, max 4, target 0.7 of 4 slots) under 2 streams,
              stepped to 6 (x3, which takes 3 instances) then back to 2: seconds from the step to
              the control plane's scale-up decision (its event) and to the new instance serving
              (ready in the gateway), the time back to 1, and failed/truncated requests
              throughout; median of `--step-runs` runs.
  scaledown   4 instances under 4 streams, scaled down by one every `--scaledown-every` seconds
              (30 s; 8 s with --quick) to 1: failed and truncated requests.
  oscillation the autoscaler's pure core (`autoscale.decide` and its `Window`, clock injected)
              on virtual time: 30 simulated minutes at each constant load from 1 to 24
              requests in flight, ticks every 0.5 s, load reports every second, an instance
              serving `--start-delay` + 1 s after the decision; the demand exact, independent
              Poisson draws around the level, or the in-flight count of Poisson arrivals whose
              requests last `--osc-holds` seconds (2, 10, 30; seeded); direction changes of the
              replicas after the first one (0 is the goal) and the mean replicas, at each
              cooldown of `--osc-cooldowns` (60 and 300 s, the spec's default).
  drills      `run_drill` (what `gpuplane drill crash|node|cluster` runs) on 2 instances under 4
              streams, `--drill-runs` times each, on two local clusters (east, west) probed
              every second, a lost node or cluster answering again after 10 s: seconds from
              the fault to each recovery step, and requests failed, cut and retried.
  llama       (with --llama) the rollout on the real engine: llama.cpp with the bundled
              SmolLM2-135M, one instance per version, under 2 streams.

    .venv/bin/python benchmarks/deployments.py [--quick] [--seeds 5] [--start-delay 2] [--llama]
        [--only rollout,step,scaledown,drills,oscillation,llama] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _extras import optional_imports

with optional_imports():
    import httpx
    import numpy as np
    import uvicorn

    from _results import save
    from gpuplane.config import parse_settings
    from gpuplane.control.client import ADMIN_TOKEN_FILE
    from gpuplane.control.deployments.autoscale import Load, Rules, Window, decide
    from gpuplane.control.lab.drills import run_drill
    from gpuplane.control.lab.faults import FAULTS
    from gpuplane.control.service.service import ControlService
    from gpuplane.control.settings import (
        ClusterConfig,
        ControlConfig,
        DeclaredGpus,
        DeclaredNode,
        TeamConfig,
    )
    from gpuplane.errors import unknown_name
    from gpuplane.plane import control_app
    from gpuplane.serve.gateway import Gateway
    from gpuplane.serve.server import serving

RESULTS = Path(__file__).resolve().parent / "results" / "deployments.json"
SLICE = {"gpu_mem_mib": 8192, "gpu_cores_pct": 25}  # four instances per card
STREAM_TOKENS = 32  # a streaming request: 32 tokens at 20 ms, ~0.7 s
TICK_S = 0.5  # the control plane's schedule_interval_s (its default)
REPORT_S = 1.0  # the gateway's load reports (discovery.REPORT_S)
PROBE_S = 1.0  # each cluster's sync_interval_s: how soon a lost one is found unreachable
LOST_FOR_S = 10.0  # a drill's lost node or cluster answers again after this


# -- the stack: control plane, gateway, load -------------------------------------------------


@dataclass
class Control:
    service: ControlService
    url: str
    token: str

    def api(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, timeout=60, headers={"authorization": f"Bearer {self.token}"}
        )


@contextlib.contextmanager
def control_plane(state_dir: str) -> Iterator[Control]:
    """The control plane as `gpuplane control serve` runs it (API + tick loop), on a free port:
    two local clusters (east, west; a drill loses one) of one node x 4 declared A100s each."""
    clusters = [
        ClusterConfig(
            name=name,
            discover_gpus=False,
            sync_interval_s=PROBE_S,
            nodes=[
                DeclaredNode(
                    name=f"{name}-n0",
                    cpu_millis=64_000,
                    memory_mib=512 * 1024,
                    gpus=[DeclaredGpus(model="A100-80GB", mem_mib=81920, count=4)],
                )
            ],
        )
        for name in ("east", "west")
    ]
    config = ControlConfig(
        state_dir=state_dir,
        clusters=clusters,
        teams=[TeamConfig(name="bench")],
        kill_grace_s=2.0,
        allow_root_jobs=True,  # run as root here, the engines need this interpreter
        schedule_interval_s=TICK_S,
    )
    service = ControlService(config)
    service.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    app = control_app(service, background=True)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="control-api", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the control API did not start")
            time.sleep(0.01)
        token = (Path(state_dir) / ADMIN_TOKEN_FILE).read_text()
        yield Control(service, f"http://127.0.0.1:{port}", token)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()


@contextlib.asynccontextmanager
async def gateway(control: Control, seed: int) -> AsyncIterator[tuple[Gateway, str]]:
    settings = parse_settings(
        {"gateway": {"host": "127.0.0.1", "port": 0, "health": {"probe_interval_s": 0.2}}}
    )
    rng = random.Random(seed)
    gw = Gateway(settings, rng=rng, control=control.url, control_token=control.token)
    async with serving(settings, gw) as url:
        yield gw, url


def spec(start_delay: float, **fields: Any) -> dict[str, Any]:
    """A deployment of the simulator (4 slots, 20 ms a token) that starts in `start_delay` s."""
    return {
        "name": "chat",
        "model": "sim",
        "engine": "sim",
        "team": "bench",
        "slice": SLICE,
        "drain_timeout_s": 600,  # an instance stops once the gateway released it
        "engine_args": ["--itl-ms", "20", "--start-delay-s", f"{start_delay:g}"],
        **fields,
    }


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    truncated: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.ok + self.failed + self.truncated,
            "failed": self.failed,
            "truncated": self.truncated,
            "first_errors": self.errors[:3],
        }


async def stream(client: httpx.AsyncClient, url: str, tally: Tally, max_tokens: int) -> None:
    """One streaming chat completion, counted in `tally`."""
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    finished = False
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                tally.failed += 1
                tally.errors.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    finished = finished or bool(choices[0].get("finish_reason"))
    except httpx.HTTPError as exc:
        tally.failed += 1
        tally.errors.append(f"{type(exc).__name__}: {exc}")
        return
    if finished:
        tally.ok += 1
    else:
        tally.truncated += 1


class Streams:
    """`n` clients, each sending streaming requests back to back until stopped; `resize` changes
    how many."""

    def __init__(self, url: str, tally: Tally) -> None:
        self.url = url
        self.tally = tally
        self.client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64))
        self.workers: list[tuple[asyncio.Task[None], asyncio.Event]] = []

    async def _run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await stream(self.client, self.url, self.tally, STREAM_TOKENS)

    def resize(self, n: int) -> None:
        while len(self.workers) < n:
            stop = asyncio.Event()
            self.workers.append((asyncio.create_task(self._run(stop)), stop))
        while len(self.workers) > n:
            self.workers.pop()[1].set()  # it finishes its request, then stops

    async def close(self) -> None:
        tasks = [t for t, _ in self.workers]
        self.resize(0)
        await asyncio.gather(*tasks)
        await self.client.aclose()


async def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 180.0) -> float:
    """Poll `check` until true; the time it became true (time.time())."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        await asyncio.sleep(0.05)
    return time.time()


def versions(gw: Gateway, ready_only: bool = True) -> list[str]:
    router = gw.routers.get("chat")
    if router is None:
        return []
    return sorted(i.id.split("-")[1] for i in router.instances if i.healthy or not ready_only)


async def apply(control: Control, body: dict[str, Any]) -> None:
    async with control.api() as api:
        response = await api.post("/deployments", json=body)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"apply: {response.status_code} {response.text}")


async def delete(control: Control) -> None:
    """Delete the deployment and wait until the control plane forgot it (call it while a
    gateway reports: an instance stops once every reporting gateway released it)."""
    async with control.api() as api:
        await api.delete("/deployments/chat")

        async def gone() -> bool:
            return bool((await api.get("/deployments")).json() == [])

        deadline = time.monotonic() + 180
        while not await gone():
            if time.monotonic() > deadline:
                raise TimeoutError("the deployment deleted within 180 s")
            await asyncio.sleep(0.2)


async def events(control: Control) -> list[dict[str, Any]]:
    """The deployment's last 50 events, oldest first."""
    async with control.api() as api:
        body: list[dict[str, Any]] = (await api.get("/deployments/chat")).json()["events"]
        return sorted(body, key=lambda e: float(e["at"]))


# -- scenarios -------------------------------------------------------------------------------


async def rollout(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    """v1 → 10 % → 50 % → promoted on simulated engines, under streaming load; and the
    canary's share at 10 and 50 % over `args.weight_requests` requests per seed."""
    return await _rollout(
        control, args, spec(args.start_delay, replicas=2), 2, args.streams, args.seed_list
    )


async def llama(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    """The same rollout on the real engine: llama.cpp with the bundled SmolLM2-135M, one
    instance per version (two engines on this machine's cores), under 2 streams."""
    body = {"name": "chat", "model": "smollm2", "engine": "llamacpp", "team": "bench"}
    result = await _rollout(control, args, {**body, "drain_timeout_s": 600}, 1, 2, [])
    rolled: dict[str, Any] = result["rollout"]
    return rolled


async def _rollout(
    control: Control,
    args: argparse.Namespace,
    base: dict[str, Any],
    replicas: int,
    streams: int,
    seeds: list[int],
) -> dict[str, Any]:
    """`base` (v1, `replicas` instances) → canary v2 at 10 %, 50 % → promoted, under
    `streams` streams; the canary's share per seed in `seeds` at 10 and 50 %."""
    await apply(control, base)
    tally = Tally()
    weights: dict[str, list[float]] = {"10": [], "50": []}
    async with gateway(control, 0) as (gw, url):
        await wait_for("v1 ready", lambda: versions(gw) == ["v1"] * replicas)
        load = Streams(url, tally)
        load.resize(streams)
        stages = []
        for pct in (10, 50):
            started = time.time()
            canary = {**base, "canary": [{"version": "v2", "weight": pct, "replicas": replicas}]}
            await apply(control, canary)
            await wait_for(f"v2 ready at {pct} %", lambda: versions(gw).count("v2") == replicas)
            await asyncio.sleep(args.hold)
            stages.append({"weight": pct, "seconds": round(time.time() - started, 1)})
            print(f"  rollout at {pct} %: {tally.to_json()}", flush=True)
            for seed in seeds:  # a fresh gateway per seed: its picker starts anew
                weights[str(pct)].append(await canary_share(control, seed, args.weight_requests))
        started = time.time()
        async with control.api() as api:
            (await api.post("/deployments/chat/promote", json={})).raise_for_status()
        await wait_for("only v2 in the gateway", lambda: versions(gw, False) == ["v2"] * replicas)
        await asyncio.sleep(args.hold)
        stages.append({"weight": 100, "seconds": round(time.time() - started, 1)})
        await load.close()
        await delete(control)
    error = {
        pct: {
            "shares": [round(s, 2) for s in shares],
            "median_error_points": round(statistics.median(abs(s - int(pct)) for s in shares), 2),
            "max_error_points": round(max(abs(s - int(pct)) for s in shares), 2),
        }
        for pct, shares in weights.items()
        if shares
    }
    return {
        "rollout": {
            "engine": base["engine"],
            "streams": streams,
            "stages": stages,
            **tally.to_json(),
        },
        "weights": {"requests_per_seed": args.weight_requests, "seeds": seeds, **error},
    }


async def canary_share(control: Control, seed: int, n: int) -> float:
    """Percent of `n` requests (8 at a time, 1 token each) that a gateway seeded `seed` sent to
    v2, from its `gpuplane_instance_requests_total`."""
    async with gateway(control, seed) as (gw, url):
        await wait_for("v1 and v2 ready", lambda: versions(gw) == ["v1", "v1", "v2", "v2"])
        tally = Tally()
        async with httpx.AsyncClient(timeout=120) as client:
            sent = 0

            async def worker() -> None:
                nonlocal sent
                while sent < n:
                    sent += 1
                    await stream(client, url, tally, 1)

            await asyncio.gather(*(worker() for _ in range(8)))
            metrics = (await client.get(url + "/metrics")).text
    per_version: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("gpuplane_instance_requests_total{"):
            version = line.split('instance="', 1)[1].split("-")[1]
            per_version[version] = per_version.get(version, 0.0) + float(line.rsplit(" ", 1)[1])
    total = sum(per_version.values())
    if tally.failed or tally.truncated or total != n:
        raise RuntimeError(f"weights run: {tally.to_json()}, counted {per_version}")
    return 100 * per_version.get("v2", 0.0) / total


async def step(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    """`args.step_runs` load steps (timing varies between runs): medians, and each run."""
    runs = [await step_once(control, args) for _ in range(args.step_runs)]
    summary = {
        k: statistics.median(r[k] for r in runs) for k in ("decision_s", "serving_s", "back_to_1_s")
    }
    totals = {k: sum(r[k] for r in runs) for k in ("requests", "failed", "truncated")}
    return {
        "start_delay_s": args.start_delay,
        "cooldown_s": args.cooldown,
        "runs": len(runs),
        **summary,
        **totals,
        "each": runs,
    }


async def step_once(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    """Load x3 then back on an autoscaled deployment: decision and serving times."""
    scaling = {"min": 1, "max": 4, "target_slot_util": 0.7, "cooldown_s": args.cooldown}
    await apply(control, spec(args.start_delay, scaling=scaling))
    tally = Tally()
    async with gateway(control, 0) as (gw, url):
        await wait_for("one instance ready", lambda: len(versions(gw)) == 1)
        load = Streams(url, tally)
        load.resize(2)
        await asyncio.sleep(3 * REPORT_S)  # the control plane sees the base load
        stepped = time.time()
        load.resize(6)
        serving_at = await wait_for("a second instance ready", lambda: len(versions(gw)) == 2)
        await wait_for("a third instance ready", lambda: len(versions(gw)) == 3)
        await asyncio.sleep(args.hold)
        ups = [
            e
            for e in await events(control)
            if e["at"] >= stepped and e["message"].startswith("autoscaled from")
        ]
        back = time.time()
        load.resize(2)
        down_at = await wait_for(
            "back to one instance", lambda: len(versions(gw, False)) == 1, timeout_s=600
        )
        await load.close()
        await delete(control)
    return {
        "decision_s": round(ups[0]["at"] - stepped, 2),
        "serving_s": round(serving_at - stepped, 2),
        "steps_up": [e["message"] for e in ups],
        "back_to_1_s": round(down_at - back, 1),
        **tally.to_json(),
    }


async def scaledown(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    """4 instances under 4 streams, one fewer every `args.scaledown_every` seconds."""
    await apply(control, spec(args.start_delay, replicas=4))
    tally = Tally()
    async with gateway(control, 0) as (gw, url):
        await wait_for("4 instances ready", lambda: len(versions(gw)) == 4)
        load = Streams(url, tally)
        load.resize(4)
        for replicas in (3, 2, 1):
            await asyncio.sleep(args.scaledown_every)
            async with control.api() as api:
                scaled = await api.post("/deployments/chat/scale", json={"replicas": replicas})
                scaled.raise_for_status()
            await wait_for(
                f"{replicas} in the gateway",
                lambda n=replicas: len(versions(gw, False)) == n,  # type: ignore[misc]
            )
        await asyncio.sleep(args.hold)
        await load.close()
        await delete(control)
    return {"every_s": args.scaledown_every, "streams": 4, "from": 4, "to": 1, **tally.to_json()}


def oscillation(args: argparse.Namespace) -> dict[str, Any]:
    """The autoscaler's core on virtual time: direction changes and mean replicas at constant
    loads, for each cooldown in `args.osc_cooldowns` (the span of the scale-down window) and
    each noise model of the reported demand (`_demand`)."""
    duration = 30 * 60.0
    levels = list(range(1, 25))
    noises = ["exact", "poisson", *(f"arrivals_{hold:g}s" for hold in args.osc_holds)]
    out: dict[str, Any] = {"simulated_s": duration, "levels": levels}
    for cooldown in args.osc_cooldowns:
        rules = Rules(min=1, max=8, target_slot_util=0.7, max_queue_wait_s=5.0,
                      cooldown_s=cooldown, slots_per_instance=4)  # fmt: skip
        out[f"cooldown_{cooldown:g}s"] = {
            noise: _oscillations(rules, levels, duration, noise, args) for noise in noises
        }
    return out


def _oscillations(
    rules: Rules, levels: list[int], duration: float, noise: str, args: argparse.Namespace
) -> dict[str, Any]:
    ready_after = args.start_delay + 1.0
    runs = {  # level -> (reversals, mean replicas) per seed
        level: [
            _reversals(rules, _demand(level, duration, noise, rng), ready_after)
            for rng in (np.random.default_rng(seed) for seed in args.seed_list)
        ]
        for level in levels
    }
    totals = [sum(runs[level][i][0] for level in levels) for i in range(len(args.seed_list))]
    replicas = [statistics.mean(runs[level][i][1] for level in levels)
                for i in range(len(args.seed_list))]  # fmt: skip
    return {
        "median_per_level": [statistics.median(r for r, _ in runs[level]) for level in levels],
        "max_per_level": [max(r for r, _ in runs[level]) for level in levels],
        "totals_per_seed": totals,
        "median_total": statistics.median(totals),
        "range_total": [min(totals), max(totals)],
        "mean_replicas": round(statistics.median(replicas), 2),
    }


def _demand(level: int, duration: float, noise: str, rng: Any) -> list[int]:
    """The demand the gateway reports each second at a constant `level`: exactly the level;
    independent Poisson draws around it (requests shorter than a report); or the in-flight count
    of Poisson arrivals at `level / hold` a second, each lasting an exponential `hold` seconds
    (`arrivals_<hold>s`: M/M/inf, Poisson around the level at any instant and correlated over
    `hold`), started `10 * hold` before the first report so it is at its level from the start."""
    reports = int(duration / REPORT_S)
    if noise == "exact":
        return [level] * reports
    if noise == "poisson":
        return [int(d) for d in rng.poisson(level, reports)]
    hold = float(noise.removeprefix("arrivals_").removesuffix("s"))
    warmup = 10 * hold
    count = rng.poisson(level / hold * (duration + warmup))
    arrive = rng.uniform(-warmup, duration, count)
    leave = arrive + rng.exponential(hold, count)
    at = np.arange(reports) * REPORT_S
    started = np.searchsorted(np.sort(arrive), at, side="right")
    ended = np.searchsorted(np.sort(leave), at, side="right")
    return [int(n) for n in started - ended]


def _reversals(rules: Rules, demand: list[int], ready_after: float) -> tuple[int, float]:
    """Direction changes of the replicas over the reports of `demand` (one each `REPORT_S`),
    and the replicas wanted on average over that time."""
    wanted, changed = rules.min, None
    starting: list[float] = []  # when each instance of a step serves
    serving = wanted
    window = Window(rules.cooldown_s)
    last_dir, reversals, replica_s = 0, 0, 0.0
    waited_since: float | None = None
    duration = len(demand) * REPORT_S
    t = 0.0
    while t < duration:
        serving = min(wanted, serving + sum(1 for s in starting if s <= t))
        starting = [s for s in starting if s > t]
        if t % REPORT_S == 0:  # the gateway's report of this second's demand
            asked = demand[int(t / REPORT_S)]
            slots = serving * rules.slots_per_instance
            queued = max(0, asked - slots)
            waited_since = (waited_since if waited_since is not None else t) if queued else None
            wait = 0.0 if waited_since is None else t - waited_since
            window.add(Load(min(asked, slots), queued, wait, t))
        new = decide(rules, wanted, serving, window, t, changed)
        if new != wanted:
            direction = 1 if new > wanted else -1
            reversals += last_dir != 0 and direction != last_dir
            last_dir = direction
            if new > wanted:
                starting.append(t + ready_after)
            else:
                serving = new  # the drained one leaves at once
            wanted, changed = new, t
        replica_s += wanted * TICK_S
        t += TICK_S
    return reversals, replica_s / duration


async def drills(control: Control, args: argparse.Namespace) -> dict[str, Any]:
    """`gpuplane drill crash|node|cluster` (`run_drill`) on 2 instances under 4 streams,
    `args.drill_runs` times each: the time to each recovery step, and what the clients saw."""
    out: dict[str, Any] = {"runs": args.drill_runs, "lost_for_s": LOST_FOR_S}
    await apply(control, spec(args.start_delay, replicas=2))
    async with gateway(control, 0) as (gw, url):
        for fault in FAULTS:
            runs = []
            for _ in range(args.drill_runs):
                await wait_for("2 instances ready", lambda: len(versions(gw)) == 2)
                await wait_for("every cluster answers", lambda: not control.service.clusters.down)
                result = await run_drill(
                    fault,
                    "chat",
                    control=control.url,
                    gateway=url,
                    control_token=control.token,
                    clients=4,
                    max_tokens=STREAM_TOKENS,
                    lost_for_s=LOST_FOR_S,
                )
                runs.append(result.to_json())
                print(f"  drill {fault}: {json.dumps(runs[-1])}", flush=True)
            out[fault] = _drill_summary(runs)
        await delete(control)
    return out


def _drill_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of each step's time over the runs, and the clients' totals."""
    steps = ("out_of_rotation_s", "detected_s", "switched_s", "replaced_s")
    out: dict[str, Any] = {"recovered": sum(r["recovered"] for r in runs)}
    for step in (*steps, "replaced_after_detection_s"):
        seen = [r[step] for r in runs if r[step] is not None]
        out[step] = (
            {
                "median": round(statistics.median(seen), 2),
                "min": round(min(seen), 2),
                "max": round(max(seen), 2),
            }
            if seen
            else None
        )
    for count in ("requests", "failed", "cut", "retried"):
        out[count] = sum(r[count] for r in runs)
    out["first_errors"] = [e for r in runs for e in r["errors"]][:3]
    return out


# -- main ------------------------------------------------------------------------------------


LIVE = {
    "rollout": rollout,
    "step": step,
    "scaledown": scaledown,
    "drills": drills,
    "llama": llama,
}
SCENARIOS = (*LIVE, "oscillation")  # llama only with --llama


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"quick": args.quick, "start_delay_s": args.start_delay}
    with (
        tempfile.TemporaryDirectory(prefix="gpuplane-bench-deploy-") as tmp,
        control_plane(tmp) as control,
    ):
        for name in [n for n in LIVE if n in args.only]:
            began = time.monotonic()
            result = await LIVE[name](control, args)
            out.update(result if name == "rollout" else {name: result})
            print(f"{name}: {json.dumps(result)} ({time.monotonic() - began:.0f} s)", flush=True)
    if "oscillation" in args.only:
        out["oscillation"] = oscillation(args)
        print(f"oscillation: {json.dumps(out['oscillation'])}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one seed, short holds, one drill each (~2 min)"
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds where randomness enters")
    parser.add_argument("--start-delay", type=float, default=2.0, help="engine start, seconds")
    parser.add_argument("--streams", type=int, default=4, help="streaming clients in rollouts")
    parser.add_argument("--weight-requests", type=int, default=1000)
    parser.add_argument("--step-runs", type=int, default=3, help="load steps, for medians")
    parser.add_argument("--scaledown-every", type=float, default=30.0)
    parser.add_argument("--cooldown", type=float, default=10.0, help="scaling.cooldown_s")
    parser.add_argument(
        "--osc-cooldowns", type=lambda v: [float(c) for c in v.split(",")], default=[60.0, 300.0],
        help="cooldown_s values of the oscillation runs (default 60,300)",
    )  # fmt: skip
    parser.add_argument(
        "--osc-holds", type=lambda v: [float(c) for c in v.split(",")], default=[2.0, 10.0, 30.0],
        help="request lengths (s) of the oscillation runs' arrival noise (default 2,10,30)",
    )  # fmt: skip
    parser.add_argument("--drill-runs", type=int, default=3, help="runs of each drill")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds under load per stage")
    parser.add_argument(
        "--only", type=lambda v: v.split(","), default=[s for s in SCENARIOS if s != "llama"],
        help=f"comma-separated scenarios, of {', '.join(SCENARIOS)} (default: all but llama)",
    )  # fmt: skip
    parser.add_argument(
        "--llama", action="store_true",
        help="also the rollout on real llama.cpp (SmolLM2-135M; a few minutes on 2 cores)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.step_runs, args.scaledown_every, args.drill_runs = 1, 1, 8.0, 1
        args.hold, args.cooldown = 2.0, 5.0
    args.seed_list = list(range(args.seeds))
    args.only += ["llama"] * args.llama
    for name in set(args.only) - set(SCENARIOS):
        parser.error(f"--only: {unknown_name('scenario', name, SCENARIOS)}")
    began = time.monotonic()
    out = asyncio.run(run(args))
    out["wall_s"] = round(time.monotonic() - began, 1)
    save(out, args.out, quick=args.quick, echo_json=args.json)


if __name__ == "__main__":
    main()
