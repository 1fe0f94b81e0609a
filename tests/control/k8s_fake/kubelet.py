"""The fake cluster's scheduler, kubelet and Job controller, reduced to what an adapter observes:
Pods bound to the node their nodeSelector names and started, their containers run as local
processes (`run_commands`) or finished by the test, graceful deletion (SIGTERM, then SIGKILL
after the grace period), evictions with the DisruptionTarget condition, and Jobs that make Pods
from their template and take their conditions from them."""

from __future__ import annotations

import contextlib
import copy
import os
import queue
import signal
import subprocess
import threading
import uuid
from typing import TYPE_CHECKING, Any

from tests.control.k8s_fake.state import ApiError, Event, Obj, now_iso

if TYPE_CHECKING:
    from tests.control.k8s_fake import FakeKubeApi


class Kubelet:
    def __init__(self, fake: FakeKubeApi, *, run_commands: bool, auto_start: bool) -> None:
        self.fake = fake
        self.run_commands = run_commands
        self.auto_start = auto_start
        self.procs: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.started: list[str] = []  # "namespace/name" of each Pod started, in order
        self._work: queue.Queue[Event | None] = queue.Queue()
        self._lock = threading.Lock()
        fake.state.listeners.append(self._on_event)
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=5)
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _on_event(self, event: Event) -> None:  # called under the state's lock: only enqueue
        if event.type == "ADDED" and event.resource in ("pods", "jobs"):
            self._work.put(event)

    def _loop(self) -> None:
        while (event := self._work.get()) is not None:
            meta = event.obj["metadata"]
            try:
                if event.resource == "jobs":
                    self._job_pod(meta["namespace"], meta["name"])
                else:
                    self._schedule(meta["namespace"], meta["name"])
            except ApiError:  # deleted meanwhile
                pass

    # -- scheduler and kubelet ---------------------------------------------------------------

    def _schedule(self, ns: str, name: str) -> None:
        state = self.fake.state
        pod = state.get("pods", ns, name)
        spec = pod["spec"]
        node = spec.get("nodeName") or spec.get("nodeSelector", {}).get("kubernetes.io/hostname")
        try:
            state.get("nodes", "", node or "")
        except ApiError:

            def unschedulable(o: Obj) -> None:
                o["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": f"0/1 nodes are available: node {node!r} not found",
                    }
                ]

            state.update("pods", ns, name, unschedulable)
            return
        if not self.auto_start:
            state.update("pods", ns, name, lambda o: o["spec"].__setitem__("nodeName", node))
            return
        container = spec["containers"][0]

        def running(o: Obj) -> None:
            o["spec"]["nodeName"] = node
            o["status"] = {
                "phase": "Running",
                "startTime": now_iso(),
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": now_iso()}},
                    }
                ],
            }

        state.update("pods", ns, name, running)
        self.started.append(f"{ns}/{name}")
        if spec.get("activeDeadlineSeconds"):
            self._after(spec["activeDeadlineSeconds"], self._pod_deadline, ns, name)
        if self.run_commands:
            self._run(ns, name, pod["metadata"]["uid"], container)

    def _run(self, ns: str, name: str, uid: str, container: Obj) -> None:
        argv = [*container.get("command", []), *container.get("args", [])]
        env = {**os.environ, **{e["name"]: e.get("value", "") for e in container.get("env", [])}}
        cwd = container.get("workingDir")
        try:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd if cwd and os.path.isdir(cwd) else None,
                start_new_session=True,
            )
        except OSError as exc:
            self.fake.write_log(uid, f"exec: {exc}\n".encode())
            self.terminate(ns, name, 128, "StartError")
            return
        with self._lock:
            self.procs[(ns, name)] = proc
        threading.Thread(target=self._reap, args=(ns, name, uid, proc), daemon=True).start()

    def _reap(self, ns: str, name: str, uid: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            self.fake.write_log(uid, chunk)
        proc.stdout.close()
        code = proc.wait()
        with self._lock:
            self.procs.pop((ns, name), None)
        try:
            pod = self.fake.state.get("pods", ns, name)
        except ApiError:
            return
        if pod["metadata"].get("deletionTimestamp"):
            self.fake.state.remove("pods", ns, name)
        elif pod["status"].get("phase") == "Running":
            self.terminate(ns, name, code if code >= 0 else 128 - code)

    def _kill(self, ns: str, name: str, sig: int) -> bool:
        with self._lock:
            proc = self.procs.get((ns, name))
        if proc is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        return True

    def terminate(self, ns: str, name: str, exit_code: int, reason: str | None = None) -> Obj:
        """The container ended with `exit_code` (reason: Completed, Error, OOMKilled, ...)."""
        why = reason or ("Completed" if exit_code == 0 else "Error")

        def ended(o: Obj) -> None:
            status = o["status"]
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            for cs in status.get("containerStatuses", []):
                started = cs.get("state", {}).get("running", {}).get("startedAt", now_iso())
                cs["ready"] = False
                cs["state"] = {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": why,
                        "startedAt": started,
                        "finishedAt": now_iso(),
                    }
                }

        pod = self.fake.state.update("pods", ns, name, ended)
        self._kill(ns, name, signal.SIGKILL)
        self._job_sync(pod)
        return pod

    def evict(self, ns: str, name: str, message: str) -> Obj:
        """The kubelet evicts the Pod (node pressure): Failed, reason Evicted, DisruptionTarget."""
        self._kill(ns, name, signal.SIGKILL)

        def evicted(o: Obj) -> None:
            status = o["status"]
            status.update(phase="Failed", reason="Evicted", message=message)
            status["conditions"] = [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": message,
                }
            ]
            for cs in status.get("containerStatuses", []):
                cs["state"] = {"terminated": {"exitCode": 137, "reason": "Error"}}

        pod = self.fake.state.update("pods", ns, name, evicted)
        self._job_sync(pod)
        return pod

    def _after(self, seconds: float, fn: Any, *args: Any) -> None:
        timer = threading.Timer(seconds, fn, args)
        timer.daemon = True
        timer.start()

    def _pod_deadline(self, ns: str, name: str) -> None:
        with contextlib.suppress(ApiError):  # gone meanwhile
            if self.fake.state.get("pods", ns, name)["status"].get("phase") == "Running":
                self.stop_at_deadline(ns, name)

    def _job_deadline(self, ns: str, name: str) -> None:
        """The Job controller ends a Job past its activeDeadlineSeconds and deletes its Pods."""
        try:
            job = self.fake.state.get("jobs", ns, name)
        except ApiError:
            return
        if job["status"].get("conditions"):
            return  # it ended first
        self._job_end(
            ns, name, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline"
        )
        for pod in list(self.fake.state.iter_objects("pods")):
            if pod["metadata"].get("labels", {}).get("job-name") == name:
                with contextlib.suppress(ApiError):
                    self.delete_pod(ns, pod["metadata"]["name"], 0)

    def stop_at_deadline(self, ns: str, name: str) -> Obj:
        self._kill(ns, name, signal.SIGKILL)

        def past(o: Obj) -> None:
            o["status"].update(
                phase="Failed",
                reason="DeadlineExceeded",
                message="Pod was active on the node longer than the specified deadline",
            )

        return self.fake.state.update("pods", ns, name, past)

    def delete_pod(self, ns: str, name: str, grace: int | None) -> Obj:
        state = self.fake.state
        pod = state.get("pods", ns, name)
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        if pod["metadata"].get("deletionTimestamp"):
            return pod  # already terminating: a second delete changes nothing
        running = pod["status"].get("phase") == "Running"
        if grace == 0 or not running:
            self._kill(ns, name, signal.SIGKILL)
            state.remove("pods", ns, name)
            return pod

        def terminating(o: Obj) -> None:
            o["metadata"]["deletionTimestamp"] = now_iso()
            o["metadata"]["deletionGracePeriodSeconds"] = grace

        pod = state.update("pods", ns, name, terminating)
        if self._kill(ns, name, signal.SIGTERM):
            timer = threading.Timer(grace, self._kill, (ns, name, signal.SIGKILL))
            timer.daemon = True
            timer.start()
        else:  # a container with no process here stops at SIGTERM
            state.remove("pods", ns, name)
        return pod

    # -- Job controller ----------------------------------------------------------------------

    def _job_pod(self, ns: str, job_name: str) -> None:
        job = self.fake.state.get("jobs", ns, job_name)
        template = copy.deepcopy(job["spec"]["template"])
        uid = job["metadata"]["uid"]
        meta = template.setdefault("metadata", {})
        meta["name"] = f"{job_name}-{uuid.uuid4().hex[:5]}"
        meta["labels"] = {
            **meta.get("labels", {}),
            "controller-uid": uid,
            "batch.kubernetes.io/controller-uid": uid,
            "job-name": job_name,
            "batch.kubernetes.io/job-name": job_name,
        }
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job_name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        self.fake.state.create("pods", ns, {"metadata": meta, "spec": template["spec"]})

        if job["spec"].get("activeDeadlineSeconds") and not job.get("status", {}).get("startTime"):
            self._after(job["spec"]["activeDeadlineSeconds"], self._job_deadline, ns, job_name)

        def active(o: Obj) -> None:
            o.setdefault("status", {}).update(
                active=1, startTime=o["status"].get("startTime", now_iso())
            )

        self.fake.state.update("jobs", ns, job_name, active)

    def _job_sync(self, pod: Obj) -> None:
        labels = pod["metadata"].get("labels", {})
        job_name, ns = labels.get("job-name"), pod["metadata"]["namespace"]
        if job_name is None:
            return
        try:
            job = self.fake.state.get("jobs", ns, job_name)
        except ApiError:
            return
        spec, status = job["spec"], job.get("status", {})
        phase = pod["status"]["phase"]
        if phase == "Succeeded":
            self._job_end(ns, job_name, "Complete", None, "", succeeded=1)
            return
        disrupted = any(
            c.get("type") == "DisruptionTarget" for c in pod["status"].get("conditions", [])
        )
        codes = [
            cs["state"]["terminated"]["exitCode"]
            for cs in pod["status"].get("containerStatuses", [])
            if "terminated" in cs.get("state", {})
        ]
        for rule in spec.get("podFailurePolicy", {}).get("rules", []):
            if _rule_matches(rule, disrupted, codes):
                if rule["action"] == "Ignore":
                    self._work.put(Event(0, "jobs", "ADDED", job, None))
                    return
                if rule["action"] == "FailJob":
                    self._job_end(
                        ns,
                        job_name,
                        "Failed",
                        "PodFailurePolicy",
                        f"Container main for pod {ns}/{pod['metadata']['name']} failed "
                        f"with exit code {codes[0] if codes else 'unknown'} matching "
                        "FailJob rule",
                        failed=1,
                    )
                    return
                break
        failed = int(status.get("failed", 0)) + 1
        if failed > int(spec.get("backoffLimit", 6)):
            self._job_end(
                ns,
                job_name,
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
                failed=failed,
            )
        else:
            self.fake.state.update(
                "jobs", ns, job_name, lambda o: o["status"].update(failed=failed)
            )
            self._work.put(Event(0, "jobs", "ADDED", job, None))

    def _job_end(
        self, ns: str, name: str, type_: str, reason: str | None, message: str, **counts: int
    ) -> None:
        def end(o: Obj) -> None:
            cond: dict[str, Any] = {
                "type": type_,
                "status": "True",
                "lastTransitionTime": now_iso(),
            }
            if reason:
                cond.update(reason=reason, message=message)
            o["status"].update(active=0, conditions=[cond], **counts)
            if type_ == "Complete":
                o["status"]["completionTime"] = now_iso()

        self.fake.state.update("jobs", ns, name, end)


def _rule_matches(rule: Obj, disrupted: bool, codes: list[int]) -> bool:
    if "onPodConditions" in rule:
        return disrupted and any(c["type"] == "DisruptionTarget" for c in rule["onPodConditions"])
    on = rule.get("onExitCodes")
    if on is None or not codes:
        return False
    inside = codes[0] in on["values"]
    return inside if on["operator"] == "In" else not inside
