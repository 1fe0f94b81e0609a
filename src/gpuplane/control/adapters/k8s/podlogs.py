"""The logs of a Kubernetes adapter's Pods: streamed from the API while the Pod lives, and a
copy kept in the cluster's state dir when it is deleted (the Pod API forgets it with the Pod)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.adapters.k8s.api import KubeApi
from gpuplane.control.adapters.k8s.reflector import describe_error
from gpuplane.control.statedir import private_dir

log = logging.getLogger("gpuplane.control.kubernetes")


class PodLogs:
    """Job logs under `state_dir`/logs, one file per job id; `where` names the cluster."""

    def __init__(self, state_dir: Path, where: str) -> None:
        self.state_dir = state_dir
        self.where = where

    def path(self, job_id: str) -> Path:
        return self.state_dir / "logs" / f"{job_id}.log"

    def keep(self, api: KubeApi, job_id: str, pod: tuple[str, str]) -> None:
        """Copy the output of the job's Pod `pod` (namespace, name) into the state dir before it
        is deleted, so `job logs` still answers for an ended or cancelled job (as the Pod API
        no longer will). A failure only loses the copy: it is logged, never raised."""
        path = self.path(job_id)
        tmp = path.with_suffix(".tmp")
        try:
            private_dir(path.parent)  # 0700: jobs cannot read the state dir
            with tmp.open("wb") as f:
                for block in self.stream(api, *pod, None, 0):
                    f.write(block)
            tmp.replace(path)
        except Exception as exc:
            log.warning("%s: could not keep the log of job %s: %s", self.where, job_id, exc)
            tmp.unlink(missing_ok=True)

    def stream(
        self, api: KubeApi, namespace: str, name: str, tail: int | None, since: int
    ) -> Iterator[bytes]:
        """The Pod's log from the API, its errors mapped into AdapterError."""
        try:
            yield from api.pod_log(namespace, name, tail, since)
        except api.exception as exc:
            raise AdapterError(
                f"{self.where}: could not read the log of Pod {namespace}/{name}: "
                f"{describe_error(exc)}"
            ) from exc
