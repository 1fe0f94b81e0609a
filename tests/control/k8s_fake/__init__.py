"""A fake Kubernetes API server, standing in for one that cannot run on this machine (no
kube-apiserver, etcd-backed control plane or kubelet can be installed here). It is faithful to the
wire format the official client and `kubectl` speak (see `server.py`: discovery per emulated
minor version, list/watch with resourceVersion, bookmarks, chunked streams, 409/404/410, field
and label selectors, Pod logs), and it plays the parts of a cluster's other components just
enough for an adapter to be tested end to end:

- HAMi's device plugin: `add_node` registers a node's cards in the `hami.io/node-nvidia-register`
  annotation (JSON, or the older `id,count,mem,cores,type,numa,health:` form);
- the scheduler and kubelet (`kubelet.py`): a new Pod is bound to the node its nodeSelector names
  and started; with `run_commands` its container's command really runs here as a process (its
  output is the Pod log, its exit code the container's); otherwise tests move Pods through
  phases, exit codes, OOMKilled and evictions with `finish`, `oom_kill`, `evict`;
- the Job controller: a batch/v1 Job gets a Pod from its template, and its conditions follow it
  (podFailurePolicy's Ignore on DisruptionTarget, backoffLimit);
- KServe's controller (`kserve.py`, only with `kserve=True`, which also makes the server serve
  serving.kserve.io/v1beta1): a new InferenceService is Ready with its address, the one
  `serve(isvc)` gives (e.g. an engine the test started); `kserve.fail` makes its predictor fail.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.control.k8s_fake.kserve import KServeController
from tests.control.k8s_fake.kubelet import Kubelet
from tests.control.k8s_fake.server import FakeHttpServer
from tests.control.k8s_fake.state import ApiError, Obj, State, now_iso

HAMI_REGISTER = "hami.io/node-nvidia-register"


def hami_card(
    uuid: str,
    *,
    index: int,
    mem_mib: int = 81920,
    model: str = "NVIDIA-A100-SXM4-80GB",
    count: int = 10,
    cores: int = 100,
    health: bool = True,
    mode: str = "hami-core",
) -> dict[str, Any]:
    """One card as HAMi's device plugin registers it (the JSON form's keys)."""
    return {
        "id": uuid,
        "index": index,
        "count": count,
        "devmem": mem_mib,
        "devcore": cores,
        "type": model,
        "numa": 0,
        "mode": mode,
        "health": health,
    }


def encode_register(cards: list[dict[str, Any]], legacy: bool = False) -> str:
    """The annotation's value: HAMi >= 2.4 writes JSON; older plugins the `:`-separated form."""
    if not legacy:
        return json.dumps(cards)
    return "".join(
        f"{c['id']},{c['count']},{c['devmem']},{c['devcore']},{c['type']},{c['numa']},"
        f"{str(c['health']).lower()}:"
        for c in cards
    )


def write_kubeconfig(
    url: str, path: str | os.PathLike[str] | None = None, context: str = "fake"
) -> str:
    """A kubeconfig whose one context points at the fake server at `url`; its path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": url}}],
        "users": [{"name": context, "user": {}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    if path is None:
        fd, path = tempfile.mkstemp(suffix=".kubeconfig")
        os.close(fd)
    Path(path).write_text(json.dumps(config))
    return str(path)


class FakeKubeApi:
    """One fake cluster at `url`; `start()` / `stop()` (idempotent), or use as a context."""

    def __init__(
        self,
        minor: int = 29,
        *,
        run_commands: bool = False,
        auto_start: bool = True,
        history_limit: int = 100_000,
        bookmark_interval_s: float = 1.0,
        kserve: bool = False,
        serve: Callable[[Obj], str | None] | None = None,
    ) -> None:
        self.minor = minor
        self.state = State(history_limit=history_limit)
        self.logs: dict[str, bytes] = {}  # by Pod uid: a new Pod of the same name starts empty
        self.requests: list[tuple[str, str]] = []
        self.bookmark_interval_s = bookmark_interval_s
        self.unreachable = False  # every request answered 503
        self.watch_generation = 0
        self.watch_lag_s = 0.0  # each batch of watch events is sent this much later
        self.slow_creates = 0  # this many Pod or Job creates answer only after slow_create_s
        self.slow_create_s = 0.0
        self.kubelet = Kubelet(self, run_commands=run_commands, auto_start=auto_start)
        self.kserve = KServeController(self, serve) if kserve else None
        self._http: FakeHttpServer | None = None
        self.address = ""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeKubeApi:
        self._http = FakeHttpServer(self)
        host, port = self._http.server_address[:2]
        self.address = f"{host!s}:{port}"
        self._http.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self) -> None:
        self.kubelet.stop()
        if self.kserve is not None:
            self.kserve.stop()
        self.state.close()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> FakeKubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kubeconfig(self, path: str | os.PathLike[str] | None = None, context: str = "fake") -> str:
        """Write a kubeconfig pointing at this server (no credentials: it has no auth)."""
        return write_kubeconfig(self.url, path, context)

    # -- what HAMi's device plugin and an admin do --------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        cards: list[dict[str, Any]] | None = None,
        cpu: str = "64",
        memory: str = "512Gi",
        legacy_register: bool = False,
    ) -> Obj:
        annotations = {}
        if cards:
            annotations[HAMI_REGISTER] = encode_register(cards, legacy_register)
            annotations["hami.io/node-handshake"] = f"Reported {now_iso()}"
        allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
        if cards:
            allocatable["nvidia.com/gpu"] = str(sum(c["count"] for c in cards))
        node = {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                "annotations": annotations,
            },
            "spec": {},
            "status": {
                "capacity": dict(allocatable),
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": f"v1.{self.minor}.3"},
            },
        }
        return self.state.create("nodes", "", node)

    def set_cards(self, node: str, cards: list[dict[str, Any]]) -> Obj:
        """HAMi's plugin re-registers the node's cards (e.g. one turned unhealthy)."""

        def change(obj: Obj) -> None:
            obj["metadata"]["annotations"][HAMI_REGISTER] = encode_register(cards)

        return self.state.update("nodes", "", node, change)

    def remove_node(self, name: str) -> None:
        self.state.remove("nodes", "", name)

    def create_namespace(self, name: str) -> Obj:
        return self.state.create("namespaces", "", {"metadata": {"name": name}})

    def end_watches(self) -> None:
        """End every open watch stream, as an API server's restart does."""
        with self.state.lock:
            self.watch_generation += 1
            self.state.cond.notify_all()

    def compact(self) -> None:
        """etcd compaction: a watch from an older resourceVersion now gets 410 Gone."""
        self.state.compact()

    # -- what the kubelet does ---------------------------------------------------------------

    def check_pod(self, pod: Obj) -> None:
        containers = pod.get("spec", {}).get("containers") or []
        if not containers or not all(c.get("image") for c in containers):
            raise ApiError(
                422, "Invalid", "Pod is invalid: spec.containers[0].image: Required value"
            )

    def pod_done(self, ns: str, name: str) -> bool:
        try:
            pod = self.state.get("pods", ns, name)
        except ApiError:
            return True
        return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")

    def finish(self, ns: str, name: str, exit_code: int, reason: str | None = None) -> Obj:
        return self.kubelet.terminate(ns, name, exit_code, reason)

    def oom_kill(self, ns: str, name: str) -> Obj:
        return self.kubelet.terminate(ns, name, 137, "OOMKilled")

    def evict(
        self, ns: str, name: str, message: str = "The node was low on resource: memory."
    ) -> Obj:
        return self.kubelet.evict(ns, name, message)

    def deadline_exceeded(self, ns: str, name: str) -> Obj:
        """The kubelet stops a Pod at its activeDeadlineSeconds."""
        return self.kubelet.stop_at_deadline(ns, name)

    def write_log(self, uid: str, data: bytes) -> None:
        self.logs[uid] = self.logs.get(uid, b"") + data

    def delete(self, resource: str, ns: str, name: str, grace: Any, policy: Any) -> Obj:
        obj = self.state.get(resource, ns, name)
        if resource == "pods":
            return self.kubelet.delete_pod(ns, name, None if grace is None else int(grace))
        if resource == "jobs" and policy in ("Background", "Foreground"):
            uid = obj["metadata"]["uid"]
            for pod in list(self.state.iter_objects("pods")):
                if pod["metadata"].get("labels", {}).get("controller-uid") == uid:
                    self.kubelet.delete_pod(
                        pod["metadata"]["namespace"], pod["metadata"]["name"], grace
                    )
        self.state.remove(resource, ns, name)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]},
        }


__all__ = [
    "HAMI_REGISTER",
    "ApiError",
    "FakeKubeApi",
    "encode_register",
    "hami_card",
    "write_kubeconfig",
]
