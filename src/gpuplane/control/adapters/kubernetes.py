"""The `kubernetes` adapter: a cluster whose GPUs HAMi shares, through the official `kubernetes`
client (extra `kubernetes`, imported at first use).

Registration reads the server's `/version` and discovery documents and refuses a version outside the
supported range (`k8s/versions.py`). Inventory is the Ready, schedulable nodes with their labels,
allocatable CPU and memory and the healthy cards HAMi registered on them (`hami.io/node-nvidia-
register`), kept current by a watch (`k8s/reflector.py`; the connection and its watches:
`k8s/watches.py`). A bound job is a Pod, or a batch/v1 Job (`bind_kind: job`), named after the job
id in its team's namespace, pinned to its node and cards (`k8s/manifests.py`); a deployment instance
(a job with `serve`) is a KServe InferenceService (raw deployment mode, one replica) whose predictor
is pinned the same way, watched like Pods: Ready gives its URL to `status` (the controller's
`instance_url`), a predictor KServe gave up on fails the job with KServe's reason; a cluster that
does not serve serving.kserve.io/v1beta1 refuses such a job (`serving_refusal`). The name makes
`bind` idempotent: a retry (after a timeout, or by a restarted service) finds the object by its name
(409) and takes it back when it is this job's on the same placement. What runs is watched too (the
objects labelled with this service process's `service_id`), so `status`, `workloads` and adoption
after a restart need no records of their own: the cluster keeps the state. `release` keeps a copy of
the Pod's log in the state dir (`k8s/podlogs.py`: the Pod API forgets it with the Pod), then deletes
with the cluster's grace period. Every client or transport error is mapped into an AdapterError
saying what to do."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from gpuplane.control.adapters.base import (
    AdapterError,
    ClusterAdapter,
    Inventory,
    InventoryChange,
    Workload,
    WorkloadState,
    WorkloadStatus,
    register,
)
from gpuplane.control.adapters.k8s import manifests
from gpuplane.control.adapters.k8s.api import KubeApi
from gpuplane.control.adapters.k8s.convert import (
    job_status,
    object_view,
)
from gpuplane.control.adapters.k8s.manifests import Binding
from gpuplane.control.adapters.k8s.podlogs import PodLogs
from gpuplane.control.adapters.k8s.reflector import describe_error
from gpuplane.control.adapters.k8s.watches import KSERVE, KubeWatches
from gpuplane.control.logtail import read_log

log = logging.getLogger("gpuplane.control.kubernetes")


@register
class KubernetesAdapter(ClusterAdapter):
    """Pods (or Jobs) on a Kubernetes cluster with HAMi."""

    kind: ClassVar[str] = "kubernetes"
    unsupported: ClassVar[dict[str, str]] = {
        "per-job images": "the cluster's `image` runs every job's command (specs name no image)",
    }

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.service_id = self.control.service_id or ""
        self.kube = KubeWatches(self.cluster, self.service_id, self.where, self._inventory_changed)
        self.pod_logs = PodLogs(self.state_dir, self.where)
        self._listeners: list[Callable[[], None]] = []
        # the nodes the watch changed since `changes()` was last asked; None: it listed since
        self._changed: set[str] | None = None
        # bound here, with the uid of the object made (the watch may not show it yet, or may
        # still show the object of an earlier bind of that job: same name, another uid)
        self._bound: dict[str, tuple[Binding, str]] = {}
        self._released: set[str] = set()  # deleted here, perhaps still shown by the watch
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        ctx = f" context {self.cluster.context}" if self.cluster.context else ""
        config = self.cluster.kubeconfig or "the default kubeconfig"
        return f"cluster {self.cluster.name} ({config}{ctx})"

    def reachable(self) -> tuple[bool, str]:
        return self.kube.reachable()

    def version(self) -> str:
        return self.kube.profile.git_version if self.kube.profile is not None else ""

    def serving_refusal(self) -> str | None:
        """None when the cluster serves KServe's InferenceService (a deployment instance is
        one), else what to do; AdapterError when the cluster cannot be asked."""
        self.kube.connect()
        assert self.kube.profile is not None
        if KSERVE in self.kube.profile.groups:
            return None
        return (
            f"{self.where} does not serve {KSERVE} (KServe's InferenceService), which runs "
            f"deployment instances there: install KServe on cluster {self.cluster.name} or "
            "place the deployment on another cluster (placement.cluster)"
        )

    # -- inventory ---------------------------------------------------------------------------

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the watch's thread: it should only signal) whenever the watch
        changes what `inventory()` answers, so a syncer writes it to the store at once rather
        than every sync interval."""
        self._listeners.append(callback)

    def _inventory_changed(self, key: tuple[str, str] | None) -> None:
        with self._lock:
            if key is None:  # listed: everything may have changed
                self._changed = None
            elif self._changed is not None:
                self._changed.add(key[1])
        for callback in self._listeners:
            callback()

    def inventory(self) -> Inventory:
        self.kube.connect()
        views = sorted(self.kube.synced(self.kube.nodes).snapshot(), key=lambda v: v.node.name)
        for problem in (v.problem for v in views if v.problem):
            log.warning("%s: %s", self.where, problem)
        cards = sum(len(v.node.devices) for v in views)
        unhealthy = sum(v.unhealthy for v in views)
        left_out = f", {unhealthy} unhealthy left out" if unhealthy else ""
        return Inventory(
            tuple(v.node for v in views),
            f"Kubernetes {self.version()} ({self.where}): {len(views)} Ready node(s), "
            f"{cards} HAMi card(s){left_out}",
        )

    def changes(self) -> InventoryChange | None:
        """The nodes the watch changed since the last call, as `inventory()` now reports them;
        None the first time and after a relist (a 410 Gone)."""
        self.kube.connect()
        nodes = self.kube.synced(self.kube.nodes)
        with self._lock:
            changed, self._changed = self._changed, set()
        if changed is None:
            return None
        views = {name: nodes.view.get(("", name)) for name in sorted(changed)}
        return InventoryChange(
            tuple(v.node for v in views.values() if v is not None),
            tuple(name for name, v in views.items() if v is None),
        )

    # -- workloads ---------------------------------------------------------------------------

    def _kind(self) -> str:
        return "Job" if self.cluster.bind_kind == "job" else "Pod"

    def _binding(self, workload: Workload) -> Binding:
        assert self.kube.nodes is not None
        view = self.kube.synced(self.kube.nodes).view.get(("", workload.node))
        if view is None:
            raise AdapterError(
                f"{self.where}: node {workload.node} is not a Ready, schedulable node there "
                "now; the job is placed again once the inventory is refreshed"
            )
        missing = [d.index for d in workload.devices if d.index not in view.uuids]
        if missing:
            raise AdapterError(
                f"{self.where}: node {workload.node} has no healthy HAMi card with index "
                f"{', '.join(map(str, missing))} (it has {sorted(view.uuids)}); the job is "
                "placed again once the inventory is refreshed"
            )
        serving = workload.serve is not None
        return Binding(
            manifests.namespace_of(self.cluster, workload.team),
            manifests.object_name(workload.job_id, manifests.ISVC_NAME_MAX if serving else 63),
            tuple(view.uuids[d.index] for d in workload.devices),
            "InferenceService" if serving else self._kind(),
        )

    def _manifest(self, workload: Workload, binding: Binding) -> dict[str, Any]:
        if workload.serve is not None:
            refusal = self.serving_refusal()
            if refusal is not None:
                raise AdapterError(refusal)
            return manifests.inference_service(workload, binding, self.cluster, self.service_id)
        if self.cluster.bind_kind == "job":
            assert self.kube.profile is not None
            return manifests.job_manifest(
                workload, binding, self.cluster, self.service_id, self.kube.profile
            )
        return manifests.pod_manifest(workload, binding, self.cluster, self.service_id)

    def bind(self, workload: Workload) -> None:
        """Create the workload's Pod (or Job; a deployment instance's InferenceService). On
        409 the existing object is read: this job's, on the same node and cards, it is taken
        back; this job's elsewhere or on its way out, it is deleted at once and created again;
        anyone else's is an error."""
        if not workload.command:
            raise AdapterError(f"job {workload.job_id} has an empty command")
        api = self.kube.connect()
        binding = self._binding(workload)
        body = self._manifest(workload, binding)
        kind = body["kind"]
        for attempt in range(3):
            try:
                uid = api.create(binding, body)["metadata"]["uid"]
                break
            except api.exception as exc:
                if exc.status != 409:
                    raise AdapterError(
                        f"{self.where}: could not create {kind} {binding.namespace}/"
                        f"{binding.name}: {describe_error(exc)}"
                    ) from exc
                existing = object_view(self._read(api, binding, kind))
                if existing is None or existing.job_id != workload.job_id:
                    raise AdapterError(
                        f"{self.where}: a {kind} named {binding.namespace}/{binding.name} "
                        f"already exists and is not job {workload.job_id}'s; delete it "
                        "(kubectl delete) and the job is bound on the next try"
                    ) from None
                same = (existing.node, existing.uuids) == (workload.node, binding.uuids)
                if same and not existing.terminating:
                    uid = existing.uid
                    break  # ours, as asked: taken back
                api.delete(binding, kind, grace=0)
            except api.transport_errors as exc:  # a timeout: the next try finds it by name
                if attempt == 2:
                    raise AdapterError(
                        f"{self.where}: could not create {kind} {binding.namespace}/"
                        f"{binding.name}: {describe_error(exc)}"
                    ) from exc
        else:
            raise AdapterError(
                f"{self.where}: {kind} {binding.namespace}/{binding.name} is still being "
                "deleted; the job is bound on the next try"
            )
        with self._lock:
            self._bound[workload.job_id] = (binding, uid)
            self._released.discard(workload.job_id)

    def _read(self, api: KubeApi, binding: Binding, kind: str) -> dict[str, Any]:
        return self.kube.call(
            f"read {kind} {binding.namespace}/{binding.name}", lambda: api.read(binding, kind)
        )

    def status(self, job_ids: Iterable[str]) -> dict[str, WorkloadStatus]:
        api = self.kube.connect()
        views, pods = self.kube.views()
        with self._lock:
            bound, released = dict(self._bound), set(self._released)
        out = {}
        for job_id in job_ids:
            view = views.get(job_id)
            made = bound.get(job_id)
            if job_id in released:
                out[job_id] = WorkloadStatus(
                    WorkloadState.LOST, None, "released: its object was deleted"
                )
            elif view is None or (made is not None and view.uid != made[1]):
                out[job_id] = self._unseen(api, job_id, made)
            elif view.kind == "Job":
                out[job_id] = job_status(view.raw, pods.get(job_id, []))
            else:
                out[job_id] = view.status
        return out

    def _unseen(
        self, api: KubeApi, job_id: str, made: tuple[Binding, str] | None
    ) -> WorkloadStatus:
        """A job whose object the watch has not shown: just bound (the watch lags; it may still
        show the object of an earlier bind, deleted since), or gone. Read from the server."""
        if made is not None:
            try:
                view = object_view(self._read(api, made[0], made[0].kind))
            except AdapterError as exc:
                if getattr(exc.__cause__, "status", None) != 404:
                    return WorkloadStatus(WorkloadState.RUNNING, None, str(exc))
                view = None
            if view is not None:
                return view.status  # a Job's: running until the watch shows its Pods
        return WorkloadStatus(
            WorkloadState.LOST,
            None,
            f"{self.where} has no Pod, Job or InferenceService of this job (deleted outside "
            "gpuplane?)",
        )

    def release(self, job_id: str) -> None:
        """Keep the log, then delete the object. Until the delete succeeds the job stays bound
        here (`workloads` lists it), so the reconciler's next release tries again."""
        with self._lock:
            made = self._bound.get(job_id)
        binding = None if made is None else made[0]
        try:
            api = self.kube.connect()
            view = self.kube.views()[0].get(job_id)
        except AdapterError as exc:
            if binding is None:
                log.warning("releasing job %s: %s", job_id, exc)
                return
            view = None
        if view is not None:
            binding = Binding(view.namespace, view.name, view.uuids, view.kind)
        if binding is not None:
            kind = binding.kind
            pod = self._pod_of(job_id)
            if pod is not None:
                self.pod_logs.keep(api, job_id, pod)
            try:
                api.delete(binding, kind, self.cluster.grace_period_s)
            except Exception as exc:  # never raises: the reconciler deletes it again
                log.warning(
                    "%s: could not delete %s %s/%s of job %s: %s; tried again on the next release",
                    self.where,
                    kind,
                    binding.namespace,
                    binding.name,
                    job_id,
                    describe_error(exc),
                )
                return
        with self._lock:
            if self._bound.get(job_id) == made:  # not bound again meanwhile
                self._bound.pop(job_id, None)
                self._released.add(job_id)

    def workloads(self) -> list[str]:
        """What the watch shows of this instance's, less what is on its way out, and what was
        bound here since (the watch may not have shown it yet)."""
        views, _ = self.kube.views()
        held = {job_id for job_id, view in views.items() if not view.terminating}
        with self._lock:
            self._released &= set(views)  # forgotten once the watch shows it gone
            held -= self._released
            held.update(self._bound)
        return sorted(held)

    def logs(self, job_id: str, tail: int | None = None, since: int = 0) -> Iterator[bytes]:
        api = self.kube.connect()
        with self._lock:
            released = job_id in self._released
        pod = None if released else self._pod_of(job_id)
        if pod is None:  # released: what was kept when its Pod was deleted, if anything
            return read_log(self.log_path(job_id), tail, since=since)
        return self.pod_logs.stream(api, *pod, tail, since)

    def _pod_of(self, job_id: str) -> tuple[str, str] | None:
        """The namespace and name of the job's latest Pod: as the watch shows it, or, for a
        bare Pod the watch has not shown yet, the one bound here."""
        _, pods = self.kube.views()
        latest = max(pods.get(job_id, []), key=lambda p: p.created, default=None)
        if latest is not None:
            return latest.namespace, latest.name
        with self._lock:
            made = self._bound.get(job_id)
        if made is None or made[0].kind != "Pod":
            return None
        return made[0].namespace, made[0].name

    def log_path(self, job_id: str) -> Path:
        return self.pod_logs.path(job_id)

    def close(self) -> None:
        if self.kube.api is not None:
            for job_id in self.workloads():
                self.release(job_id)
        self.kube.stop()
