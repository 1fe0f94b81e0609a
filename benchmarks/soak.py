"""Soak: the plane under steady mixed load for a long time, the RSS of every process sampled.

The plane as on a machine of its own, each part a process: the control plane (`gpuplane control
serve`, SQLite, one local cluster of declared cards), the gateway that serves its deployments
(`gpuplane gateway serve --control URL`, the token in $GPUPLANE_TOKEN) and the simulated
engines the control plane runs as jobs of its local adapter (`gpuplane engine sim`, 20 ms a
token). The load, steady and mixed, each kind at a fixed pace and bounded in count:

  chat         `--streams` clients sending chat completions back to back through the gateway
               (3 of 4 streamed, 16 tokens), to a steady deployment `chat` (2 instances);
  jobs         a job submitted every `--job-every` s (`sleep 30`), cancelled 2 s later;
  deployments  `scaled` (1 instance) scaled to 2 and back every `--scale-every` s, and `chat`
               applied again unchanged (an idempotent apply) at the same pace;
  console      a logged-in browser loading one console page every `--page-every` s.

Every `--sample-s` s the RSS of the control plane, the gateway and every process below the
control plane (engines, jobs) is read (psutil). A process's growth is the median of its last
10 % of samples over the median of its first 10 % after `--warmup-min` minutes, for each process
that lived through the whole measured window (short-lived jobs and engines are counted, not
judged). Goal: under 5 % for every process. Results: benchmarks/results/soak.json.

    nice .venv/bin/python benchmarks/soak.py [--minutes 30] [--warmup-min 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from _results import save

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
GOAL_GROWTH = 0.05
TEAM = "soak"
PAGES = ("/ui", "/ui/jobs", "/ui/gpus", "/ui/events", "/ui/deployments", "/ui/quotas")


# -- the pure core: growth after warm-up ----------------------------------------------------


def growth(samples: list[tuple[float, int]], warm_until: float, end: float) -> float | None:
    """Relative RSS growth of one process: the median of its last 10 % of samples (by count)
    over the median of its first 10 % after `warm_until`; None unless it was sampled through
    the whole window (`warm_until` to `end`, within one sample of each) with 10 or more
    samples, as a short-lived process cannot be judged."""
    after = [rss for t, rss in samples if t >= warm_until]
    if len(after) < 10 or samples[0][0] > warm_until or samples[-1][0] < end:
        return None
    tenth = max(1, len(after) // 10)
    first, last = statistics.median(after[:tenth]), statistics.median(after[-tenth:])
    return last / first - 1


def judged(
    series: dict[str, list[tuple[float, int]]], warm_until: float, end: float
) -> dict[str, Any]:
    """Each long-lived process's RSS at the start and the end of the window and its growth; how
    many short-lived ones were seen; whether every growth is below the goal."""
    processes: dict[str, dict[str, Any]] = {}
    growths: list[float] = []
    for name, samples in series.items():
        g = growth(samples, warm_until, end)
        if g is not None:
            growths.append(round(100 * g, 2))
            after = [rss for t, rss in samples if t >= warm_until]
            processes[name] = {
                "rss_mib_after_warmup": round(after[0] / 2**20, 1),
                "rss_mib_end": round(after[-1] / 2**20, 1),
                "rss_mib_peak": round(max(after) / 2**20, 1),
                "samples": len(after),
                "growth_pct": round(100 * g, 2),
                # the whole run, warm-up included, in 20 steps: where any growth happened
                "rss_mib_in_20_steps": [
                    round(rss / 2**20, 1) for _, rss in samples[:: max(1, len(samples) // 20)]
                ],
            }
    worst = max(growths, default=None)
    return {
        "processes": processes,
        "short_lived_processes": len(series) - len(processes),
        "max_growth_pct": worst,
        "goal_pct": 100 * GOAL_GROWTH,
        "goal_met": worst is not None and worst < 100 * GOAL_GROWTH,
    }


# -- the plane: two processes and the engines below the first --------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Plane:
    control: subprocess.Popen[bytes]
    gateway: subprocess.Popen[bytes]
    control_url: str
    gateway_url: str
    token: str


def _config(work: Path, control_port: int, gateway_port: int) -> Path:
    node = {
        "name": "n0",
        "cpu_millis": 64_000,
        "memory_mib": 512 * 1024,
        "gpus": [{"model": "A100-80GB", "mem_mib": 81920, "count": 4}],
    }
    config = {
        "control": {
            "port": control_port,
            "state_dir": str(work / "state"),
            "clusters": [{"name": "local", "discover_gpus": False, "nodes": [node]}],
            "teams": [{"name": TEAM}],
            "kill_grace_s": 2.0,
            "allow_root_jobs": True,  # run as root here: the engines need this interpreter
        },
        "gateway": {"host": "127.0.0.1", "port": gateway_port},
    }
    path = work / "gpuplane.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _wait_healthy(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{url} exited with {proc.returncode} while starting:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url}/healthz within {timeout_s:g} s")


@contextlib.contextmanager
def plane(work: Path) -> Iterator[Plane]:
    """The control plane and the gateway as two processes, logging under `work`; stopped with
    SIGTERM (the control plane with --stop-jobs, so its engines and jobs stop too)."""
    cport, gport = free_port(), free_port()
    config = _config(work, cport, gport)
    cli = [sys.executable, "-m", "gpuplane.cli.main"]
    control_url, gateway_url = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{gport}"
    with (work / "control.log").open("wb") as clog, (work / "gateway.log").open("wb") as glog:
        control = subprocess.Popen(
            [*cli, "control", "serve", "--config", str(config), "--stop-jobs"],
            stdout=clog,
            stderr=subprocess.STDOUT,
        )
        gateway = None
        try:
            _wait_healthy(control_url, control, work / "control.log")
            token = (work / "state" / "admin.token").read_text().strip()
            env = {**os.environ, "GPUPLANE_TOKEN": token}
            gateway = subprocess.Popen(
                [*cli, "gateway", "serve", "--config", str(config), "--control", control_url],
                stdout=glog,
                stderr=subprocess.STDOUT,
                env=env,
            )
            _wait_healthy(gateway_url, gateway, work / "gateway.log")
            yield Plane(control, gateway, control_url, gateway_url, token)
        finally:
            for proc in (gateway, control):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=60)


# -- the load ---------------------------------------------------------------------------------


@dataclass
class Tally:
    """Per kind of load: calls answered as expected, and the others (with the first few)."""

    ok: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def count(self, kind: str, good: bool, why: str = "") -> None:
        bucket = self.ok if good else self.failed
        bucket[kind] = bucket.get(kind, 0) + 1
        if not good and len(self.errors) < 10:
            self.errors.append(f"{kind}: {why}"[:300])

    def total(self) -> int:
        return sum(self.ok.values()) + sum(self.failed.values())


def _sim(name: str, replicas: int) -> dict[str, Any]:
    return {
        "name": name,
        "model": "sim",
        "engine": "sim",
        "team": TEAM,
        "replicas": replicas,
        "slice": {"gpu_mem_mib": 8192, "gpu_cores_pct": 25},
        "engine_args": ["--itl-ms", "20"],
    }


async def _call(
    tally: Tally, kind: str, api: httpx.AsyncClient, method: str, path: str, **kw: Any
) -> httpx.Response | None:
    try:
        response = await api.request(method, path, **kw)
    except httpx.HTTPError as exc:
        tally.count(kind, False, f"{method} {path}: {type(exc).__name__}: {exc}")
        return None
    good = response.status_code < 400
    tally.count(kind, good, f"{method} {path}: {response.status_code} {response.text[:200]}")
    return response


async def chat(url: str, tally: Tally, i: int, until: float, budget: Iterator[int]) -> None:
    """One client: chat completions back to back until `until` or the request budget is spent."""
    body: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for n in budget:
            if time.monotonic() >= until:
                return
            stream = (n + i) % 4 != 0
            asked = {**body, "max_tokens": 16, "stream": stream}
            try:
                async with client.stream("POST", "/v1/chat/completions", json=asked) as response:
                    text = (await response.aread()).decode()
                done = response.status_code == 200 and (not stream or "[DONE]" in text)
                tally.count("chat", done, f"{response.status_code} {text[:200]}")
            except httpx.HTTPError as exc:
                tally.count("chat", False, f"{type(exc).__name__}: {exc}")


async def _paced(every_s: float, until: float, rounds: int) -> AsyncIterator[int]:
    for n in range(rounds):
        if time.monotonic() >= until:
            return
        yield n
        await asyncio.sleep(every_s)


async def jobs(api: httpx.AsyncClient, tally: Tally, every_s: float, until: float) -> None:
    async for n in _paced(every_s, until, 100_000):
        spec = {"name": f"soak-{n}", "team": TEAM, "command": ["sleep", "30"], "resources": {}}
        submitted = await _call(tally, "job submit", api, "POST", "/jobs", json=spec)
        if submitted is not None and submitted.status_code < 400:
            await asyncio.sleep(2)
            ref = submitted.json()["id"]
            await _call(tally, "job cancel", api, "POST", f"/jobs/{ref}/cancel")


async def deployments(api: httpx.AsyncClient, tally: Tally, every_s: float, until: float) -> None:
    async for n in _paced(every_s, until, 100_000):
        scale = {"replicas": 2 if n % 2 == 0 else 1}
        await _call(tally, "deploy scale", api, "POST", "/deployments/scaled/scale", json=scale)
        await _call(tally, "deploy apply", api, "POST", "/deployments", json=_sim("chat", 2))


async def console(url: str, token: str, tally: Tally, every_s: float, until: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as browser:
        await _call(tally, "console login", browser, "POST", "/ui/login", data={"token": token})
        pages = itertools.cycle([*PAGES, "/ui/deployments/chat"])
        async for _ in _paced(every_s, until, 100_000):
            await _call(tally, "console page", browser, "GET", next(pages))


# -- sampling -----------------------------------------------------------------------------------


def _label(proc: psutil.Process, roles: dict[int, str]) -> str:
    if proc.pid in roles:
        return roles[proc.pid]
    argv = proc.cmdline()
    if "engine" in argv and "sim" in argv:  # the job's wrapper names its child's argv too
        what = "job wrapper of engine sim" if proc.children() else "engine sim"
        return f"{what} (pid {proc.pid})"
    return f"{os.path.basename(argv[0]) if argv else '?'} (pid {proc.pid})"


async def sample(
    p: Plane, every_s: float, until: float, series: dict[str, list[tuple[float, int]]]
) -> None:
    """The RSS of the control plane, the gateway and every process below the control plane,
    every `every_s` seconds until `until` (time.monotonic())."""
    roles = {p.control.pid: "control plane", p.gateway.pid: "gateway"}
    root = psutil.Process(p.control.pid)
    while time.monotonic() < until:
        now = time.monotonic()
        with contextlib.suppress(psutil.NoSuchProcess):
            procs = [root, psutil.Process(p.gateway.pid), *root.children(recursive=True)]
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    series.setdefault(_label(proc, roles), []).append((now, proc.memory_info().rss))
        await asyncio.sleep(every_s)


# -- the run ------------------------------------------------------------------------------------


async def soak(p: Plane, args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    headers = {"authorization": f"Bearer {p.token}"}
    async with httpx.AsyncClient(base_url=p.control_url, timeout=60, headers=headers) as api:
        for spec in (_sim("chat", 2), _sim("scaled", 1)):
            (await api.post("/deployments", json=spec)).raise_for_status()
        await _until_serving(p.gateway_url, 3)
        began = time.monotonic()
        until = began + 60 * args.minutes
        series: dict[str, list[tuple[float, int]]] = {}
        budget = iter(range(args.max_requests))
        await asyncio.gather(
            sample(p, args.sample_s, until, series),
            *(chat(p.gateway_url, tally, i, until, budget) for i in range(args.streams)),
            jobs(api, tally, args.job_every, until),
            deployments(api, tally, args.scale_every, until),
            console(p.control_url, p.token, tally, args.page_every, until),
        )
        ended = time.monotonic()
    warm_until = began + 60 * args.warmup_min
    return {
        "minutes": round((ended - began) / 60, 2),
        "warmup_min": args.warmup_min,
        "sample_s": args.sample_s,
        "load": {"ok": tally.ok, "failed": tally.failed, "first_errors": tally.errors},
        "requests": tally.total(),
        **judged(series, warm_until, until - args.sample_s),
    }


async def _until_serving(url: str, instances: int, timeout_s: float = 180) -> None:
    """Wait until a chat completion to each deployment succeeds (the gateway found them)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for model in ("chat", "scaled"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            while (await client.post("/v1/chat/completions", json=body)).status_code != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{instances} instances serving within {timeout_s:g} s")
                await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="load duration")
    parser.add_argument("--warmup-min", type=float, default=3.0, help="not judged, minutes")
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--streams", type=int, default=2, help="chat clients")
    parser.add_argument("--max-requests", type=int, default=50_000, help="chat requests at most")
    parser.add_argument("--job-every", type=float, default=5.0)
    parser.add_argument("--scale-every", type=float, default=30.0)
    parser.add_argument("--page-every", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="2 minutes, 0.5 of warm-up")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.warmup_min, args.sample_s, args.scale_every = 2.0, 0.5, 2.0, 20.0
    with tempfile.TemporaryDirectory(prefix="gpuplane-soak-") as work, plane(Path(work)) as p:
        out = asyncio.run(soak(p, args))
    for name, proc in out["processes"].items():
        print(f"  {name}: {proc['rss_mib_after_warmup']} -> {proc['rss_mib_end']} MiB, "
              f"{proc['growth_pct']:+.2f} %")  # fmt: skip
    print(f"requests {out['requests']}, failed {out['load']['failed']}, "
          f"short-lived processes {out['short_lived_processes']}, "
          f"max growth {out['max_growth_pct']} % (goal < 5 %: {out['goal_met']})")  # fmt: skip
    save(out, args.out, echo_json=args.json)


if __name__ == "__main__":
    main()
