"""The `ray` adapter: a Ray cluster's nodes as inventory, each workload one Ray job.

It speaks the Ray dashboard's HTTP APIs at the cluster's `address`: the state API's node list
(`/api/v0/nodes`) for inventory and the Job Submission REST API (`/api/jobs/`, what
`ray.job_submission.JobSubmissionClient` calls) for everything else. Over httpx rather than
through that client: the client sets no timeout, so a dashboard that accepts a connection and
never answers would hang the control loop (seen on this machine: a submit stuck for minutes);
here every call times out after `sync_interval_s` and its failure becomes an `AdapterError`
once, in `_call`. The control plane needs no `ray` install at all. A cluster that requires Ray's
token authentication gets its token as a bearer header (`ray_auth.py` says where it is read).

Inventory: every ALIVE node; its `GPU` resource is its card count, its `gpu_mem_mib` custom
resource the memory of all its cards (split evenly; unset: `default_gpu_mem_mib` each), the model
from the node's `gpuplane.io/gpu-model` label, else Ray's `accelerator_type:<model>` resource,
else `default_gpu_model`. A node is named by its `gpuplane.io/node` label (`ray start --labels`),
else by its Ray node id. Every node is vGPU-splittable: fractional `num_gpus` shares a card.

Bind submits a Ray job whose submission id is the gpuplane job id, pinned to its node by a label
selector, with `entrypoint_num_gpus` (whole cards, or the slice's share of one) and
`entrypoint_resources={"gpu_mem_mib": ...}` where the node declares that resource. Ray picks
the card within the node and sets `CUDA_VISIBLE_DEVICES` itself: gpuplane's card index is its
own accounting. Submission ids are unique in a Ray cluster, which makes bind idempotent: a job
already submitted on the same placement is taken back (a retry after a lost answer, or a
restarted service), on another placement it is stopped and submitted afresh. `release` stops the
Ray job and deletes it, so a requeued job can be submitted again under its id. The submission
body and the reading of a job's state are pure, in `ray_jobs.py`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx

from gpuplane.control.adapters.base import (
    AdapterError,
    ClusterAdapter,
    DiscoveredDevice,
    DiscoveredNode,
    Inventory,
    Workload,
    WorkloadState,
    WorkloadStatus,
    register,
)
from gpuplane.control.adapters.ray_auth import find_token, refusal
from gpuplane.control.adapters.ray_jobs import (
    GPU_MEM,
    META_PLACEMENT,
    MIB,
    job_status,
    own_output,
    placement_of,
    ray_request,
)
from gpuplane.control.logtail import BLOCK, read_log, tail_start
from gpuplane.control.statedir import private_dir
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_NODE, LABEL_REGION, LABEL_VGPU

log = logging.getLogger("gpuplane.control.ray")

RAY_NODE_ID = "ray.io/node-id"  # the label Ray gives every node
ACCELERATOR = "accelerator_type:"
META_SERVICE_ID = "gpuplane.io/instance"
META_CLUSTER = "gpuplane.io/cluster"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
MONITOR_PERIOD_S = 1.0  # Ray's JobManager.JOB_MONITOR_LOOP_PERIOD_S


class _NotFound(AdapterError):
    """Ray answered 404: no such job."""


@register
class RayAdapter(ClusterAdapter):
    """Ray jobs on a Ray cluster, through its dashboard's job API at `cluster.address`."""

    kind: ClassVar[str] = "ray"
    unsupported: ClassVar[dict[str, str]] = {
        "card pinning": "Ray assigns the card within the node; gpuplane pins the node only",
        "gpu isolation": "fractional num_gpus is Ray's accounting; HAMi's limits go in env",
    }

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.address = str(self.cluster.address).rstrip("/")
        self.where = f"ray cluster {self.cluster.name} at {self.address}"
        self._token = find_token(self.cluster.token_file)
        auth = {"Authorization": f"Bearer {self._token.value}"} if self._token else {}
        self._http = httpx.Client(
            base_url=self.address, timeout=self.cluster.sync_interval_s, headers=auth
        )
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[dict[str, str], bool]] = {}  # name -> selector, gpu mem?
        self._released: set[str] = set()  # stopped, not yet deleted (Ray was slow to stop)

    # -- the edge: every call to Ray, its errors mapped once -----------------------------------

    def _call(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AdapterError(
                f"{self.where}: could not {what}: unreachable ({type(exc).__name__}: {exc}); "
                "check that its dashboard runs and that `address` is its URL"
            ) from exc
        if response.status_code == 404:
            raise _NotFound(f"{self.where}: could not {what}: not found")
        if response.status_code in (401, 403):
            raise refusal(self.where, response.status_code, self._token)
        if response.status_code >= 400:
            raise AdapterError(
                f"{self.where}: could not {what}: Ray answered {response.status_code}: "
                f"{response.text.strip()[:500]}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise AdapterError(
                f"{self.where}: could not {what}: its answer is not JSON "
                f"({response.text[:200]!r}); is `address` the dashboard's URL?"
            ) from exc

    def _job(self, job_id: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = self._call(f"read job {job_id}", "GET", f"/api/jobs/{job_id}")
        except _NotFound:
            return None
        return info

    # -- inventory ---------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        answer = self._call(
            "list its nodes", "GET", "/api/v0/nodes", params={"detail": "1", "limit": "10000"}
        )
        rows = [n for n in answer["data"]["result"]["result"] if n.get("state") == "ALIVE"]
        nodes, seen = [], {}
        for row in sorted(rows, key=lambda n: (n.get("labels") or {}).get(LABEL_NODE, "")):
            node, selector, has_mem = self._node(row)
            nodes.append(node)
            seen[node.name] = (selector, has_mem)
        with self._lock:
            self._nodes = seen
        gpus = sum(len(n.devices) for n in nodes)
        return Inventory(
            tuple(nodes), f"Ray at {self.address}: {len(nodes)} node(s), {gpus} GPU(s)"
        )

    def version(self) -> str:
        try:
            answer = self._call("read its version", "GET", "/api/version")
        except AdapterError:
            return ""
        found = answer.get("ray_version") if isinstance(answer, dict) else None
        return f"Ray {found}" if found else ""

    def _node(self, row: dict[str, Any]) -> tuple[DiscoveredNode, dict[str, str], bool]:
        resources: dict[str, float] = row.get("resources_total") or {}
        ray_labels: dict[str, str] = row.get("labels") or {}
        node_id = str(row["node_id"])
        name = ray_labels.get(LABEL_NODE) or node_id
        selector = {LABEL_NODE: name} if LABEL_NODE in ray_labels else {RAY_NODE_ID: node_id}
        count = int(resources.get("GPU", 0))
        total_mem = resources.get(GPU_MEM)
        per_card = (
            int(total_mem) // count if total_mem and count else self.control.default_gpu_mem_mib
        )
        accel = [k.removeprefix(ACCELERATOR) for k in resources if k.startswith(ACCELERATOR)]
        model = ray_labels.get(LABEL_GPU_MODEL) or (accel[0] if accel else "")
        model = model or self.control.default_gpu_model
        labels = {k: v for k, v in ray_labels.items() if not k.startswith("ray.io/")}
        labels = {LABEL_REGION: self.cluster.region, LABEL_VGPU: "true", **labels}
        if count:
            labels[LABEL_GPU_MODEL] = model
        node = DiscoveredNode(
            name=name,
            cpu_millis=int(resources.get("CPU", 0) * 1000),
            memory_mib=int(resources.get("memory", 0)) // MIB,
            labels=labels,
            devices=tuple(DiscoveredDevice(i, model, per_card) for i in range(count)),
        )
        return node, selector, total_mem is not None

    def _placed_on(self, node: str) -> tuple[dict[str, str], bool]:
        """The label selector that pins a job to `node`, and whether it declares GPU memory."""
        with self._lock:
            known = self._nodes.get(node)
        if known is None:
            self.inventory()  # a node that joined since the last sync
            with self._lock:
                known = self._nodes.get(node)
        if known is None:
            raise AdapterError(
                f"{self.where} has no alive node {node!r}; it left the cluster since it was "
                "placed there: submit the job again"
            )
        return known

    # -- workloads ---------------------------------------------------------------------------

    def bind(self, workload: Workload) -> None:
        if not workload.command:
            raise AdapterError(f"job {workload.job_id} has an empty command")
        selector, has_mem = self._placed_on(workload.node)
        body = ray_request(workload, selector, has_mem)
        body["metadata"] |= {
            META_SERVICE_ID: str(self.control.service_id),
            META_CLUSTER: self.cluster.name,
        }
        if self._take_back(workload):
            return
        try:
            self._call(f"submit job {workload.job_id}", "POST", "/api/jobs/", json=body)
        except AdapterError as exc:
            if "already exists" in str(exc) and self._take_back(workload):
                return  # a concurrent bind of the same job won the submit
            raise

    def _take_back(self, workload: Workload) -> bool:
        """True if Ray already runs this job on this placement; a submission of it on another
        placement (or one released but not yet deleted) is removed first."""
        with self._lock:
            released = workload.job_id in self._released
        info = self._job(workload.job_id)
        if info is None:
            return False
        meta = info.get("metadata") or {}
        if not released and meta.get(META_PLACEMENT) == placement_of(workload):
            return True
        self.release(workload.job_id)
        if self._job(workload.job_id) is not None:
            raise AdapterError(
                f"{self.where}: an earlier submission of job {workload.job_id} is still being "
                "stopped; it is bound again on a later round"
            )
        return False

    def status(self, job_ids: Iterable[str]) -> dict[str, WorkloadStatus]:
        out = {}
        for job_id in job_ids:
            info = self._job(job_id)
            with self._lock:
                released = job_id in self._released
            if info is None or released:
                out[job_id] = WorkloadStatus(
                    WorkloadState.LOST,
                    None,
                    f"{self.where} has no job {job_id} (deleted outside gpuplane, or the Ray "
                    "cluster was restarted)",
                )
            else:
                out[job_id] = job_status(info, time.time())
        return out

    def release(self, job_id: str) -> None:
        with self._lock:
            self._released.add(job_id)  # reported lost, and removed first by a later bind
        try:
            self._stop_and_delete(job_id)
        except AdapterError as exc:  # never raises: the reconciler releases it again
            log.warning("%s; retried on the next release", exc)

    def _stop_and_delete(self, job_id: str) -> None:
        info = self._job(job_id)
        if info is not None and info.get("status") not in TERMINAL:
            with contextlib.suppress(_NotFound):
                self._call(f"stop job {job_id}", "POST", f"/api/jobs/{job_id}/stop")
            # Ray sends SIGTERM, then SIGKILL after its own wait; only an ended job is deleted
            deadline = time.monotonic() + self.control.kill_grace_s + 10
            while info is not None and info.get("status") not in TERMINAL:
                if time.monotonic() > deadline:
                    raise AdapterError(f"{self.where}: job {job_id} did not stop in time")
                time.sleep(0.1)
                info = self._job(job_id)
        if info is not None:
            self._keep_log(job_id)
            # Ray's job monitor looks once a second and stops when it sees the end; deleted
            # before that, it takes the next submission under this id for the old one and fails
            # it ("supervisor actor died"; Ray 2.60's JobManager._monitor_job)
            ended = (info.get("end_time") or 0) / 1000
            time.sleep(
                max(0.0, min(ended + 2 * MONITOR_PERIOD_S - time.time(), 2 * MONITOR_PERIOD_S))
            )
            with contextlib.suppress(_NotFound):
                self._call(f"delete job {job_id}", "DELETE", f"/api/jobs/{job_id}")
        with self._lock:
            self._released.discard(job_id)

    def workloads(self) -> list[str]:
        jobs = self._call("list its jobs", "GET", "/api/jobs/")
        return sorted(
            str(j["submission_id"])
            for j in jobs
            if (j.get("metadata") or {}).get(META_SERVICE_ID) == self.control.service_id
            and (j.get("metadata") or {}).get(META_CLUSTER) == self.cluster.name
        )

    def _log_path(self, job_id: str) -> Path:
        return self.state_dir / "logs" / f"{job_id}.log"

    def _keep_log(self, job_id: str) -> None:
        """Copy an ended job's output here before Ray's copy goes with the job (`logs` reads it)."""
        data = self._output(job_id)
        if data is None:
            return
        path = self._log_path(job_id)
        private_dir(path.parent)  # 0700: jobs cannot read the state dir
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)

    def _output(self, job_id: str) -> bytes | None:
        try:
            answer = self._call(f"read the logs of job {job_id}", "GET", f"/api/jobs/{job_id}/logs")
        except _NotFound:
            return None
        return own_output(job_id, str(answer.get("logs", "")))

    def logs(self, job_id: str, tail: int | None = None, since: int = 0) -> Iterator[bytes]:
        """From Ray while it holds the job; once released, the copy kept in the state dir."""
        data = self._output(job_id)
        if data is None:
            return read_log(self._log_path(job_id), tail, since=since)
        start = (
            min(since, len(data)) if tail is None else tail_start(io.BytesIO(data), tail, len(data))
        )
        return (data[i : i + BLOCK] for i in range(start, len(data), BLOCK))

    def close(self) -> None:
        try:
            held = self.workloads()
        except AdapterError as exc:
            log.warning("%s; its jobs are left running", exc)
            held = []
        for job_id in held:
            self.release(job_id)
        self._http.close()
