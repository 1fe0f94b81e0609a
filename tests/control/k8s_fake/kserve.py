"""The fake cluster's KServe controller, standing in for KServe's (whose controller, webhooks and
CRDs need a real cluster), reduced to what an adapter observes of an InferenceService in raw
deployment mode: a new one gets KServe's status, its conditions (IngressReady, PredictorReady,
Ready) True, `modelStatus` UpToDate, and its addresses: `status.url` (the external one) and
`status.address.url`, the cluster-internal one KServe gives a raw deployment
(`http://<name>-predictor.<namespace>.svc.cluster.local`) unless the test's `serve(isvc)` names
another (a real engine on loopback, so a gateway can answer through it), or None: it then stays
starting until the test calls `ready`. `fail` plays a predictor KServe gave up on (its container
crashing): Ready False with KServe's reason, `modelStatus` BlockedByFailedLoad with its
`lastFailureInfo`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from tests.control.k8s_fake.state import ApiError, Event, Obj, now_iso

if TYPE_CHECKING:
    from tests.control.k8s_fake import FakeKubeApi

RESOURCE = "inferenceservices"


def cluster_url(isvc: Obj) -> str:
    """The address KServe gives a raw deployment's predictor: its Service, in the cluster."""
    meta = isvc["metadata"]
    return f"http://{meta['name']}-predictor.{meta['namespace']}.svc.cluster.local"


def _condition(type_: str, status: str, reason: str | None = None, message: str = "") -> Obj:
    out: Obj = {"type": type_, "status": status, "lastTransitionTime": now_iso()}
    if reason is not None:
        out |= {"reason": reason, "message": message}
    return out


class KServeController:
    def __init__(self, fake: FakeKubeApi, serve: Callable[[Obj], str | None] | None) -> None:
        self.fake = fake
        self.serve = serve or cluster_url
        self._work: queue.Queue[Event | None] = queue.Queue()
        fake.state.listeners.append(self._on_event)
        self._thread = threading.Thread(target=self._loop, name="fake-kserve", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=5)

    def _on_event(self, event: Event) -> None:  # called under the state's lock: only enqueue
        if event.type == "ADDED" and event.resource == RESOURCE:
            self._work.put(event)

    def _loop(self) -> None:
        while (event := self._work.get()) is not None:
            meta = event.obj["metadata"]
            try:
                url = self.serve(self.fake.state.get(RESOURCE, meta["namespace"], meta["name"]))
                if url is not None:
                    self.ready(meta["namespace"], meta["name"], url)
            except ApiError:  # deleted meanwhile
                pass

    def ready(self, ns: str, name: str, url: str) -> Obj:
        """The predictor's Deployment is available: the InferenceService is Ready at `url`."""

        def ready(o: Obj) -> None:
            o["status"] = {
                "observedGeneration": 1,
                "url": f"http://{name}-{ns}.example.com",
                "address": {"url": url},
                "components": {"predictor": {"url": url}},
                "conditions": [
                    _condition(c, "True") for c in ("IngressReady", "PredictorReady", "Ready")
                ],
                "modelStatus": {
                    "transitionStatus": "UpToDate",
                    "states": {"activeModelState": "Loaded", "targetModelState": "Loaded"},
                },
            }

        return self.fake.state.update(RESOURCE, ns, name, ready)

    def fail(self, ns: str, name: str, reason: str, message: str, exit_code: int = 1) -> Obj:
        """KServe gave up on the predictor (e.g. its container keeps crashing)."""

        def failed(o: Obj) -> None:
            status = o.setdefault("status", {})
            status["conditions"] = [
                _condition("IngressReady", "True"),
                _condition("PredictorReady", "False", reason, message),
                _condition("Ready", "False", reason, message),
            ]
            status["modelStatus"] = {
                "transitionStatus": "BlockedByFailedLoad",
                "states": {"activeModelState": "", "targetModelState": "FailedToLoad"},
                "lastFailureInfo": {
                    "location": f"{name}-predictor",
                    "reason": reason,
                    "message": message,
                    "exitCode": exit_code,
                },
            }

        return self.fake.state.update(RESOURCE, ns, name, failed)
