"""The Ray runner: one actor per replica, with fractional `num_gpus` and custom resources.

A replica `(module, index, device, share, mem)` of the plan becomes an actor created with
`num_gpus=share` (a fraction of a card, or 1 for a whole one), `num_cpus=stage.cpu` and, when the
slice names memory, the custom resource `gpu_mem_mib` (declare it on the nodes, as HAMi declares
`nvidia.com/gpumem`). Ray itself is imported only in `start()`, after a short TCP connect to the
address: `ray.init` retries an unreachable cluster for minutes before it gives up.

A cluster that requires Ray's token authentication is joined with a token: `batch.ray_token_file`,
else Ray's own `RAY_AUTH_TOKEN` / `RAY_AUTH_TOKEN_PATH`. Ray reads the token, and whether to
present one at all (`RAY_AUTH_MODE=token`), only from the process environment, when it is first
imported, so `start()` sets them there first (`auth_env`); without them Ray answers a token cluster
with a bare connection error after about 20 s, which `start()` turns into one naming the settings.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any
from urllib.parse import urlsplit

from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import CPU, PackingPlan, Replica
from gpuplane.batch.pipeline import Pipeline
from gpuplane.batch.runners.base import Runner, Task, TaskResult, Worker, WorkerSpec, register
from gpuplane.secrets import read_secret

GPU_MEM_RESOURCE = "gpu_mem_mib"
CONNECT_TIMEOUT_S = 3.0
"""How long `start()` waits for the cluster's port to accept a connection."""
GCS_PORT, CLIENT_PORT = 6379, 10001  # Ray's defaults: HOST:PORT is the GCS, ray://HOST the client
TOKEN_HOW = "set batch.ray_token_file (--ray-token-file) or RAY_AUTH_TOKEN"


def auth_env(token_file: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """What the environment needs so that `ray.init` presents a token: the configured file, or
    token mode where the environment holds Ray's own token variables but no mode (a user who
    gave a token means it to be used; Ray sends none unless the mode says token)."""
    if token_file:
        # checked here: Ray aborts the whole process on an unreadable token file
        what = f"the Ray token file {token_file} (batch.ray_token_file)"
        read_secret(token_file, what, BatchError)
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_file}
    given = environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH")
    return {"RAY_AUTH_MODE": "token"} if given and "RAY_AUTH_MODE" not in environ else {}


def endpoint(address: str) -> tuple[str, int] | None:
    """Where a Ray address is reached (host, port); None for those Ray resolves itself."""
    if address in ("auto", "local"):
        return None
    url = urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = url.hostname, url.port
    except ValueError:  # a port that is not a number
        host, port = None, None
    if not host:
        raise BatchError(
            f"Ray address {address!r}: write it as HOST:PORT (the head's GCS, port {GCS_PORT}) "
            f"or ray://HOST:PORT (Ray client, port {CLIENT_PORT})"
        )
    default = CLIENT_PORT if url.scheme == "ray" else GCS_PORT
    return host, port or default


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, within `timeout_s`, an address where nothing accepts a connection."""
    where = endpoint(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError as exc:
        raise BatchError(
            f"no Ray cluster answers at {address} ({where[0]}:{where[1]}: "
            f"{exc.strerror or exc}); start one with `ray start --head` and pass "
            f"--ray-address HOST:{GCS_PORT} (or set batch.ray_address), or run with "
            "--runner local"
        ) from None


class _StageActor:
    """Body of the Ray actor: a `Worker` that also reports the GPU ids Ray gave it."""

    def __init__(self, spec: WorkerSpec) -> None:
        import ray

        self.worker = Worker(spec)
        ctx = ray.get_runtime_context()
        gpus = ",".join(str(g) for g in ray.get_gpu_ids())
        self.worker.ident = f"{ctx.get_node_id()[:12]}:gpu[{gpus}]"

    def run(self, task: Task) -> TaskResult:
        return self.worker.run(task)

    def ident(self) -> str:
        return self.worker.ident


def actor_options(replica: Replica, cpu: float, custom: bool) -> dict[str, Any]:
    """Ray actor options for one replica (pure: the tests check the mapping directly)."""
    opts: dict[str, Any] = {"num_cpus": cpu}
    if replica.device != CPU:
        opts["num_gpus"] = replica.share
        if custom and replica.mem_mib:
            opts["resources"] = {GPU_MEM_RESOURCE: replica.mem_mib}
    return opts


@register("ray")
class RayRunner(Runner):
    """Runs every replica as a Ray actor; joins `address` or the cluster already initialised."""

    def __init__(
        self,
        address: str | None = None,
        custom_resources: bool = True,
        runtime_env: Mapping[str, Any] | None = None,
        token_file: str | None = None,
    ) -> None:
        self.address = address
        self.token_file = token_file
        self.custom_resources = custom_resources
        self.runtime_env = dict(runtime_env or {})
        self._actors: dict[tuple[str, int], Any] = {}
        self._owns_ray = False
        self.idents: dict[tuple[str, int], str] = {}

    @property
    def capacity(self) -> int:
        return max(1, len(self._actors))

    def start(self, spec: WorkerSpec, plan: PackingPlan, pipeline: Pipeline) -> None:
        if spec.pipeline_spec is None:
            raise BatchError("the ray runner needs a pipeline path or module:attr, not an object")
        address = self.address or os.environ.get("RAY_ADDRESS")  # ray.init's own fallback
        os.environ.update(auth_env(self.token_file, os.environ))  # before Ray reads its config
        try:
            import ray
        except ImportError as exc:
            raise BatchError(
                'the ray runner needs Ray: pip install "gpuplane[ray]" (or pick --runner local)'
            ) from exc
        if not ray.is_initialized():
            if address:
                check_reachable(address)
            try:
                ray.init(
                    address=self.address, runtime_env=self.runtime_env or None, log_to_driver=False
                )
            except ConnectionError as exc:
                raise BatchError(
                    f"could not join the Ray cluster at {address}: {exc}; if it requires a token "
                    f"(Ray's token authentication), {TOKEN_HOW}"
                ) from exc
            self._owns_ray = True
        cls = ray.remote(max_restarts=0)(_StageActor)
        for r in plan.replicas:
            opts = actor_options(r, pipeline.stage(r.module).cpu, self.custom_resources)
            self._actors[(r.module, r.index)] = cls.options(**opts).remote(spec)
        try:  # fail now, with Ray's reason, rather than on the first task
            refs = {k: a.ident.remote() for k, a in self._actors.items()}
            self.idents = dict(zip(refs, ray.get(list(refs.values()), timeout=120), strict=True))
        except Exception as exc:
            self.stop()
            raise BatchError(
                f"could not start the plan's actors on Ray ({exc}); check that the cluster "
                f"declares enough GPUs and the custom resource {GPU_MEM_RESOURCE!r}"
            ) from exc

    def submit(self, task: Task, replica: Replica) -> Future[TaskResult]:
        actor = self._actors.get((replica.module, replica.index))
        if actor is None:
            raise BatchError(f"no actor for {replica.module}#{replica.index}: not started?")
        fut: Future[TaskResult] = actor.run.remote(task).future()
        return fut

    def stop(self) -> None:
        actors, self._actors = self._actors, {}
        if not actors and not self._owns_ray:
            return
        import ray

        for a in actors.values():
            ray.kill(a, no_restart=True)
        if self._owns_ray:
            self._owns_ray = False
            ray.shutdown()

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "address": self.address, "actors": len(self._actors)}
