"""No card is ever given to two jobs, and no job is lost or run twice, while the real
`gpuplane control serve` is killed with SIGKILL at random points of a busy run and restarted.

Jobs of random short length and exit code are submitted over the HTTP API without pause. After
each restart the service is frozen (SIGSTOP) and what the store says is compared with what runs
on this machine, read from /proc (a job's processes carry its GPUPLANE_JOB_ID): every live job is
admitted or running in the store, every job running in the store has a live process or has
ended on its own, no card is over-granted, none is lost. At the end every job ended once, with
the exit code it wrote itself. Seeded: the same kill points on every run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import select

from gpuplane.control.identity.auth import Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig
from gpuplane.control.store.models import Job
from tests.control.svc_helpers import A100, assert_no_device_over_allocated
from tests.helpers.common import free_port

KILLS = 50  # kills at least; more rounds until BUSY jobs were accepted (a slow machine's windows
BUSY = 100  # take fewer), at most MAX_KILLS
MAX_KILLS = 500
SEED = 20240607
TOKEN = f"chaos-{os.getpid()}"  # marks this test's processes in /proc


@dataclass(frozen=True, slots=True)
class Planned:
    name: str
    seconds: float
    code: int
    spec: dict[str, object]


def plan(rng: random.Random, k: int, out: Path) -> Planned:
    """Job k: a whole card or a slice, 0.05-1 s, exit code 0, 1 or 3; it writes what it did."""
    name, seconds, code = f"c{k}", round(rng.uniform(0.05, 1.0), 2), rng.choice([0, 1, 3])
    path = out / name
    script = f"echo start >> {path}; sleep {seconds}; echo exit {code} >> {path}; exit {code}"
    if rng.random() < 0.5:
        resources: dict[str, int] = {"gpus": 1}
    else:
        resources = {"gpu_mem_mib": 20480, "gpu_cores_pct": 30}
    spec = {"name": name, "team": "research", "command": ["sh", "-c", script]}
    env = {"GPUPLANE_CHAOS": TOKEN}  # a job gets none of the service's environment
    return Planned(name, seconds, code, {**spec, "env": env, "resources": resources})


def live_jobs() -> dict[str, list[int]]:
    """Job id -> pids of this test's job processes that run now (not their wrappers, which
    get none of the job's environment)."""
    out: dict[str, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if f"GPUPLANE_CHAOS={TOKEN}".encode() not in environ or state == b"Z":
            continue
        for var in environ:
            if var.startswith(b"GPUPLANE_JOB_ID="):
                out.setdefault(var.split(b"=", 1)[1].decode(), []).append(int(entry))
    return out


def running(pid: int) -> bool:
    """Whether `pid` has not yet died (neither gone nor a zombie, whose files are closed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Fleet:
    """The zygote (`serve_fork.py`) and the service child it forked last."""

    def __init__(self, tmp_path: Path, conf: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = tmp_path / "serve.log"
        env = {**os.environ, "GPUPLANE_CHAOS": TOKEN}
        cmd = [sys.executable, str(Path(__file__).parents[1] / "serve_fork.py"), str(self.log)]
        cmd += ["--port", str(port), "--config", str(conf)]
        self.zygote = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        self.pid: int | None = None

    def start(self) -> int:
        """Fork a new service once the last one has died: until then it holds the state dir
        (a kill is delivered, not yet done, when `kill` returns), and a start is refused."""
        assert self.zygote.stdin is not None
        assert self.zygote.stdout is not None
        deadline = time.monotonic() + 60
        while self.pid is not None and running(self.pid):
            assert time.monotonic() < deadline, f"service {self.pid} did not die"
            time.sleep(0.005)
        self.zygote.stdin.write("start\n")
        self.zygote.stdin.flush()
        self.pid = int(self.zygote.stdout.readline())
        return self.pid

    def wait_up(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def close(self) -> None:
        if self.pid is not None:
            self.signal(signal.SIGKILL)
        if self.zygote.stdin is not None:
            self.zygote.stdin.close()
        self.zygote.wait(timeout=60)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Fleet, ControlConfig]]:
    control = {
        "service_id": "chaos",
        "state_dir": str(tmp_path / "state"),
        "schedule_interval_s": 0.05,
        "kill_grace_s": 1.0,
        "allow_root_jobs": True,  # as root: jobs reach the test interpreter (not nobody)
        "clusters": [
            {
                "name": "local",
                "discover_gpus": False,
                "nodes": [
                    {
                        "name": "n0",
                        "cpu_millis": 64000,
                        "memory_mib": 524288,
                        "gpus": [{"model": A100, "mem_mib": 81920, "count": 4}],
                    }
                ],
            }
        ],
        "teams": [{"name": "research"}],
    }
    conf = tmp_path / "gpuplane.yaml"
    conf.write_text(yaml.safe_dump({"control": control}))
    fleet = Fleet(tmp_path, conf, free_port())
    try:
        yield fleet, ControlConfig.model_validate({**control, "service_id": "reader"})
    finally:
        fleet.close()
        for pids in live_jobs().values():  # nothing this test started outlives it
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def lines(out: Path, name: str) -> list[str]:
    path = out / name
    return path.read_text().splitlines() if path.exists() else []


def check_frozen(reader: ControlService, out: Path) -> None:
    """With the service stopped: the store's jobs against the processes that run."""
    with reader.store.session() as session:
        jobs = {row.id: row for row in session.scalars(select(Job))}
    live = live_jobs()  # after the store: jobs can only end meanwhile, not start
    for job_id in live:
        row = jobs[job_id]
        if any(line.startswith("exit") for line in lines(out, row.name)):
            continue  # the job itself has ended; only its wrapper is still recording that
        assert row.state in ("admitted", "running"), f"{job_id} runs, the store says {row.state}"
    for row in jobs.values():
        done = any(line.startswith("exit") for line in lines(out, row.name))
        if row.state == "running":
            assert row.id in live or done, f"{row.id} is running in the store, nothing runs it"
        assert not (row.state == "failed" and row.exit_code is None), f"{row.id}: {row.message}"
        assert lines(out, row.name).count("start") <= 1, f"{row.id} was started twice"
    assert_no_device_over_allocated(reader)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_at_random_points_never_double_books_loses_or_reruns_a_job(
    fleet: tuple[Fleet, ControlConfig], tmp_path: Path
) -> None:
    service, reader_config = fleet
    rng = random.Random(SEED)
    out = tmp_path / "out"
    out.mkdir()
    planned: dict[str, Planned] = {}
    accepted: set[str] = set()
    reader = ControlService(reader_config)  # reads the store; starts nothing
    _, token = reader.tokens.create("chaos", Role.admin, None)  # same store, same key
    client = httpx.Client(timeout=30, headers={"authorization": f"Bearer {token}"})
    try:
        kills = 0
        while kills < KILLS or len(accepted) < BUSY:
            assert kills < MAX_KILLS, f"only {len(accepted)} jobs accepted in {kills} rounds"
            kills += 1
            service.start()
            if rng.random() < 0.2:  # killed while it starts: taking its jobs back, or before
                time.sleep(rng.uniform(0.0, 0.3))
                service.signal(signal.SIGKILL)
                continue
            service.wait_up()
            service.signal(signal.SIGSTOP)
            check_frozen(reader, out)
            service.signal(signal.SIGCONT)
            killer = threading.Timer(rng.uniform(0.05, 0.6), service.signal, (signal.SIGKILL,))
            killer.start()
            while killer.is_alive():  # submit without pause until it is killed
                job = plan(rng, len(planned), out)
                planned[job.name] = job
                try:
                    response = client.post(f"{service.url}/jobs", json=job.spec)
                except httpx.TransportError:
                    break  # killed mid-request: the job may or may not have been queued
                assert response.status_code == 201, response.text
                accepted.add(job.name)
                time.sleep(rng.uniform(0.0, 0.05))
            killer.join()

        service.start()  # the last one is left to finish the work
        service.wait_up()
        service.signal(signal.SIGSTOP)
        check_frozen(reader, out)
        service.signal(signal.SIGCONT)
        deadline = time.monotonic() + 120
        while True:
            with reader.store.session() as session:
                rows = list(session.scalars(select(Job)))
            if all(row.state in ("succeeded", "failed") for row in rows):
                break
            assert time.monotonic() < deadline, [(r.id, r.state) for r in rows]
            time.sleep(0.1)
        service.signal(signal.SIGTERM)
    finally:
        client.close()
        reader.store.close()

    by_name = {row.name: row for row in rows}
    assert accepted <= set(by_name), "a job the API accepted is missing"
    assert len(accepted) >= BUSY, "the run was not busy"
    for name, row in by_name.items():
        job = planned[name]
        assert lines(out, name) == ["start", f"exit {job.code}"], (name, lines(out, name))
        assert row.exit_code == job.code, (name, row.exit_code, row.message)
        assert row.state == ("succeeded" if job.code == 0 else "failed"), (name, row.state)
