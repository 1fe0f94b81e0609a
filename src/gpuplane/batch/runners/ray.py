"""The Ray runner: one actor per replica, with fractional `num_gpus` and custom resources.

A replica `(module, index, device, share, mem)` of the plan becomes an actor created with
`num_gpus=share` (a fraction of a card, or 1 for a whole one), `num_cpus=stage.cpu` and, when the
slice names memory, the custom resource `gpu_mem_mib` (declare it on the nodes, as HAMi declares
`nvidia.com/gpumem`). Ray itself is imported only in `start()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import CPU, Plan, Replica
from gpuplane.batch.pipeline import Pipeline
from gpuplane.batch.runners.base import Runner, Task, TaskResult, Worker, WorkerSpec, register

GPU_MEM_RESOURCE = "gpu_mem_mib"


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
    ) -> None:
        self.address = address
        self.custom_resources = custom_resources
        self.runtime_env = dict(runtime_env or {})
        self._actors: dict[tuple[str, int], Any] = {}
        self._owns_ray = False
        self.idents: dict[tuple[str, int], str] = {}

    @property
    def capacity(self) -> int:
        return max(1, len(self._actors))

    def start(self, spec: WorkerSpec, plan: Plan, pipeline: Pipeline) -> None:
        try:
            import ray
        except ImportError as exc:
            raise BatchError(
                'the ray runner needs Ray: pip install "gpuplane[ray]" (or pick --runner local)'
            ) from exc
        if spec.pipeline_spec is None:
            raise BatchError("the ray runner needs a pipeline path or module:attr, not an object")
        if not ray.is_initialized():
            ray.init(
                address=self.address, runtime_env=self.runtime_env or None, log_to_driver=False
            )
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
