"""A real local Ray cluster for the tests: a head and workers started with `ray start --block`
on 127.0.0.1 (free ports, declared GPUs and a `gpu_mem_mib` resource: Ray accepts GPUs it cannot
see, so no GPU is needed), each in its own process group, stopped by killing those groups (never
`ray stop`, which stops every Ray on the machine). Kept small for a 2-core machine: one CPU per
node, a small object store, no usage stats.

Nothing the machine ran before reaches it: Ray's processes get a throwaway HOME (Ray 2.59+ turns
token authentication on for every later cluster once `~/.ray/auth_token` exists) and an explicit
RAY_AUTH_MODE: `disabled`, or `token` with the token given."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

RAY = str(Path(sys.executable).parent / "ray")


@dataclass(frozen=True, slots=True)
class RayNode:
    name: str  # its gpuplane.io/node label
    gpus: int
    gpu_mem_mib: int  # of all its cards
    labels: Mapping[str, str]
    cpus: int = 1  # declared, like the GPUs: what Ray lets its tasks and actors ask for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(node: RayNode) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in {"gpuplane.io/node": node.name, **node.labels}.items())
    return [
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={node.cpus}",
        f"--num-gpus={node.gpus}",
        f"--resources={json.dumps({'gpu_mem_mib': node.gpu_mem_mib})}",
        f"--labels={labels}",
        "--object-store-memory=80000000",
        "--disable-usage-stats",
        # its own port: two agents on one host cannot share the default, and the job API reads
        # a job's logs from the agent of the node it runs on
        f"--dashboard-agent-listen-port={free_port()}",
    ]


def _wait(
    what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"ray start exited with {p.returncode} before {what}")
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if ready():
                return
        time.sleep(0.25)
    raise RuntimeError(f"the local Ray cluster was not ready in {timeout:.0f}s: {what}")


@dataclass(frozen=True, slots=True)
class RayCluster:
    url: str  # the dashboard's job API: the ray adapter's address
    gcs: str  # HOST:PORT of its GCS: what `ray.init` and the batch runner join


@contextlib.contextmanager
def ray_cluster(
    nodes: list[RayNode], log_dir: Path, timeout: float = 180.0, token: str | None = None
) -> Iterator[RayCluster]:
    """Start a head (`nodes[0]`) and workers, requiring `token` where one is given; yield its
    addresses once every node is alive and a job can be submitted; stop them all on exit."""
    gcs, dash = free_port(), free_port()
    home = log_dir / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    env["RAY_AUTH_MODE"] = "token" if token else "disabled"
    if token:
        env["RAY_AUTH_TOKEN"] = token
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], name: str) -> None:
        with open(log_dir / f"ray-{name}.log", "wb") as out:
            procs.append(
                subprocess.Popen(
                    [RAY, "start", *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )

    url = f"http://127.0.0.1:{dash}"
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.Client(base_url=url, timeout=10, headers=auth)
    try:
        head = ["--head", f"--port={gcs}", "--include-dashboard=true"]
        head += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"]
        start([*head, *_args(nodes[0])], nodes[0].name)
        _wait(
            "its dashboard answers",
            lambda: http.get("/api/version").status_code == 200,
            procs,
            timeout,
        )
        for node in nodes[1:]:
            start([f"--address=127.0.0.1:{gcs}", *_args(node)], node.name)

        def alive() -> bool:
            rows = http.get("/api/v0/nodes", params={"detail": "1"}).json()["data"]["result"]
            return bool(sum(n["state"] == "ALIVE" for n in rows["result"]) == len(nodes))

        _wait(f"{len(nodes)} nodes are alive", alive, procs, timeout)
        probe = iter(range(10**6))

        def submits() -> bool:  # the job agent registers a while after the head
            body = {"entrypoint": "true", "submission_id": f"probe-{next(probe)}"}
            ok = http.post("/api/jobs/", json=body).status_code == 200
            if ok:
                http.delete(f"/api/jobs/{body['submission_id']}")
            return ok

        _wait("a job can be submitted", submits, procs, timeout)
        yield RayCluster(url, f"127.0.0.1:{gcs}")
    finally:
        http.close()
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the group: raylet, GCS, dashboard, workers
        for p in procs:
            p.wait(30)
