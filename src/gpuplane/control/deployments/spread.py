"""Restoring a deployment's spread: where one instance should move, and the move under way.

Once a settled deployment's instances could be spread better (a cluster that was lost, or full,
has room again), one moves back, make before break: `ask` answers where one more instance would
go and why (a dry run of the scheduler, nothing written); the controller starts it there and
tells `Spread` its job (`started`); while that instance starts (`moving`), the deployment keeps
one more instance than its replicas, and once it serves the reconciler's surplus rule drains
one from the most crowded cluster. `Spread` knows no controller; it asks the service's dry run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select

from gpuplane.control.adapters.local import ENGINE_HOST
from gpuplane.control.deployments.instances import JobService
from gpuplane.control.deployments.reconcile import Instance
from gpuplane.control.deployments.spec import DeploymentSpec
from gpuplane.control.store.models import Cluster


@dataclass(frozen=True, slots=True)
class Move:
    """Where one more instance restores the spread, and why (for the deployment's events)."""

    cluster: str
    why: str


class Spread:
    """The moves under way, per deployment: the instance started to restore its spread, until
    it serves."""

    def __init__(self, service: JobService) -> None:
        self.service = service
        self._moving: dict[str, str] = {}  # deployment -> the job id of its move's instance

    def moving(self, name: str) -> bool:
        """Whether a move of `name`'s was started and not yet seen over (`moved`)."""
        return name in self._moving

    def started(self, name: str, job_id: str) -> None:
        """Commit: `job_id` is the instance `name` started to restore its spread."""
        self._moving[name] = job_id

    def forget(self, name: str) -> None:
        """Drop the move of a deleted deployment. Idempotent."""
        self._moving.pop(name, None)

    def moved(self, name: str, seen: list[Instance], ready: set[str] | None) -> bool:
        """Whether a move of `name`'s is under way: its instance was placed and does not serve
        yet. Once it serves, or when it could not be placed at once (pending), ended or was
        lost, the move is over: the reconciler's surplus rule then drains one instance from the
        most crowded cluster (or the move's own, when it never ran)."""
        job_id = self._moving.get(name)
        inst = next((i for i in seen if i.job_id == job_id), None)
        under_way = (
            inst is not None
            and inst.job_state in ("admitted", "running")
            and inst.lost is None
            and inst.draining_since is None
            and not (inst.running and (ready is None or inst.job_id in ready))
        )
        if not under_way:
            self._moving.pop(name, None)
        return under_way

    def ask(
        self,
        spec: DeploymentSpec,
        seen: list[Instance],
        versions: Mapping[str, int],
        ready: set[str] | None,
    ) -> Move | None:
        """Where one instance should move back to restore the spread, or None: when the
        deployment is settled (one version, all its instances serving, none draining) and the
        scheduler would place one more instance now, without preempting, on a cluster holding
        at least two fewer of them than the most crowded one. Nothing is written."""
        live = [i for i in seen if not i.ended]
        settled = list(versions) == [spec.version] and len(live) == versions[spec.version]
        if not settled or len(live) < 2:
            return None
        if any(
            i.draining_since is not None
            or i.version != spec.version
            or not i.running
            or (ready is not None and i.job_id not in ready)
            for i in live
        ):
            return None
        crowd = Counter(i.cluster for i in live)
        if max(crowd.values()) < 2:
            return None  # one at most per cluster: already spread (no query each tick)
        with self.service.store.session() as session:
            open_clusters = session.scalars(
                select(Cluster.name).where(Cluster.unreachable.is_(None), ~Cluster.cordoned)
            ).all()
        if all(crowd[c] + 2 > max(crowd.values()) for c in open_clusters):
            return None  # no cluster could improve it: no dry run
        # a dry run: where one more would go (its port does not matter)
        answer = self.service.submit(spec.to_job(ENGINE_HOST, 1), dry_run=True)
        target = answer.get("cluster")
        if not answer["fits"] or answer.get("preempts") or target is None:
            return None
        if crowd[target] + 2 > max(crowd.values()):
            return None  # no better spread there
        fullest, holds = crowd.most_common(1)[0]
        return Move(
            str(target), f"to restore the spread: cluster {fullest} holds {holds} of {len(live)}"
        )
