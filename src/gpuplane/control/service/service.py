"""The control-plane service: submit → queue → admit (quota + placement) → bind → observe.

`ControlService` owns the state and wires the parts, each handed what it needs: the store and
its in-memory mirror (`mirror.py`: every change to allocations runs in one locked transaction,
so commits never double-book a device, across threads or processes), intake (`intake.py`:
submit), the cycle writer (`cycle_writer.py`: one admission pass, written), the binder
(`runtime.py`: bind, reconcile, stop), the clusters with their lifecycle and health
(`clusters.py`) and the records every writer shares (`records.py`); who may call it
(`tokens.py`, `oidc.py`) and the teams' secrets jobs refer to (`vault.py`).
Adapters are called outside the transaction, after the commit (bind) or after the release was
recorded (stop).
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from gpuplane.control.adapters.base import ClusterAdapter
from gpuplane.control.admission import Estate, NominationPolicy
from gpuplane.control.deployments.controller import Deployments
from gpuplane.control.deployments.instances import Instances
from gpuplane.control.deployments.loads import Loads
from gpuplane.control.deployments.spread import Spread
from gpuplane.control.errors import ConflictError
from gpuplane.control.identity.auth import Principal
from gpuplane.control.identity.oidc import OidcVerifier
from gpuplane.control.identity.tokens import PREFIX as TOKEN_PREFIX
from gpuplane.control.identity.tokens import TokenBook, service_key
from gpuplane.control.identity.vault import Vault, vault_key
from gpuplane.control.metrics import ControlMetrics
from gpuplane.control.oplog import job_event
from gpuplane.control.scheduler import DEFAULT_POLICY, make_policy
from gpuplane.control.service.clusters import Clusters, Drained
from gpuplane.control.service.cycle_writer import CycleWriter, PassRules
from gpuplane.control.service.intake import Intake
from gpuplane.control.service.inventory import RowIds
from gpuplane.control.service.moves import move_job
from gpuplane.control.service.runtime import Binder, Observed
from gpuplane.control.settings import ClusterConfig, ControlConfig, TeamConfig
from gpuplane.control.statedir import secure_state_dir
from gpuplane.control.store.mirror import Mirror
from gpuplane.control.store.models import Job, Quota, Team
from gpuplane.control.store.records import Records, job_row, quota_row
from gpuplane.control.store.store import Store
from gpuplane.control.store.trail import Retention

log = logging.getLogger("gpuplane.control")


class ControlService:
    """One control plane over the configured clusters. Thread-safe."""

    def __init__(
        self,
        config: ControlConfig,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        rng: np.random.Generator | None = None,
        new_id: Callable[[str], str] | None = None,
        bind_on_submit: bool = True,
    ) -> None:
        """`bind_on_submit` False: admitted jobs wait for `tick()` to bind them."""
        self.config = config
        self.service_id = config.service_id or f"{socket.gethostname()}:{config.port}"
        if store is None:
            secure_state_dir(config.state_dir, config.resolved_database_url())
        self.store = store or Store.open(config.resolved_database_url())
        self.clock = clock
        state_dir = Path(config.state_dir)
        self.tokens = TokenBook(self.store, service_key(state_dir), clock)
        self.vault = Vault(self.store, vault_key(state_dir), clock, config.auth.from_env)
        self.oidc = OidcVerifier(config.auth.oidc) if config.auth.oidc else None
        self.rng = rng or np.random.default_rng(0)
        self.policy = make_policy(config.policy or DEFAULT_POLICY)
        self.adapters: dict[str, ClusterAdapter] = {}
        self.metrics = ControlMetrics()
        self.retention = Retention(config.events_retention_s)
        self.mirror = Mirror(self.store)
        self.records = Records(clock)
        self.binder = Binder(
            self.adapters, self.mirror, self.records, clock, self.service_id, self.vault.env_of
        )
        # the adapters tell this instance's workloads from other instances' by its name
        control = config.model_copy(update={"service_id": self.service_id})
        self.clusters = Clusters(control, self.binder, self.mirror, self.records, clock)
        rules = PassRules(
            NominationPolicy(config.nominate_after_s, config.max_nominations),
            wait_for_faster=config.wait_for_faster_gpu,
            longest_first=config.longest_first,
        )
        self.writer = CycleWriter(
            self.mirror,
            self.records,
            self.policy,
            self.rng,
            clock,
            rules,
            self.metrics,
            self.binder.stop_later,
        )
        self.intake = Intake(
            self.mirror,
            self.writer,
            self.binder,
            self.policy,
            self.rng,
            clock,
            new_id or (lambda name: f"{name}-{uuid.uuid4().hex[:8]}"),
            config.default_team,
            bind_on_submit,
            self.vault.check_refs,
        )
        # their instances are jobs of this service
        self.deployments = Deployments(self, Instances(self), Loads(clock), Spread(self))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Register the clusters (gpuplane.yaml's and those added at run time, `clusters.py`)
        and the configured teams, then take back the jobs an earlier process with this
        `service_id` left running (`Binder.reconcile`: still running, ended while it was
        down, or lost; logged), before any pass can place a job on their cards. Returns what
        each inventory came from, and where the local admin token is (made when missing)."""
        messages = self.clusters.start()
        with self.locked() as (session, _):
            for team in self.config.teams:
                _apply_team_config(session, team)
            self.invalidate()
        token = self.tokens.local_admin(Path(self.config.state_dir))
        messages.append(f"admin token: {token} (the CLI reads it for a server on this machine)")
        seen = self.reconcile()
        summary = (
            f"reconciled on start: adopted {seen.running} running jobs, recorded {seen.exited} "
            f"exits while down, {seen.lost} lost"
        )
        if seen.timed_out:
            summary += f", {seen.timed_out} stopped past their time limit"
        log.info(
            summary,
            extra={
                "event": "reconciled",
                "adopted": seen.running,
                "exited": seen.exited,
                "lost": seen.lost,
                "timed_out": seen.timed_out,
            },
        )
        return messages

    def close(self, *, stop_jobs: bool = True) -> None:
        """Shut down. `stop_jobs`: stop the jobs this process runs, recorded cancelled; False leaves
        them running for a restart with the same `service_id` to take back (`control serve` on
        SIGTERM)."""
        if stop_jobs:
            self.binder.stop_all()
        else:
            with self.store.session() as session:
                left = session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.state == "running", Job.bound_by == self.service_id)
                )
            log.info(
                "control plane stopped; %d running jobs left running for its restart to take back",
                left,
                extra={"event": "stopped", "left_running": left},
            )
        self.store.close()

    def authenticate(self, bearer: str) -> Principal | None:
        """The caller a bearer token stands for: an API token, else a JWT when OIDC is set."""
        if bearer.startswith(TOKEN_PREFIX) or self.oidc is None:
            return self.tokens.verify(bearer)
        return self.oidc.verify(bearer)

    def tick(self) -> None:
        """One round of the background loop: check the clusters' health, observe, admit, bind,
        then keep each deployment's instances (`deployments/`); the trail within retention."""
        self.clusters.check()
        self.reconcile()
        self.schedule_pass()
        self.bind_admitted()
        self.deployments.reconcile()
        self.retention.prune(self.store, self.clock())

    # -- clusters (`clusters.py`) --------------------------------------------------------------

    def add_cluster(self, cluster: ClusterConfig) -> str:
        """Register and store a cluster at run time; returns where its inventory came from."""
        return self.clusters.add(cluster)

    def cordon(self, name: str, *, cordoned: bool = True) -> None:
        """Nothing new is placed on cluster `name` (False: uncordon, ending a drain too)."""
        self.clusters.cordon(name, cordoned=cordoned)

    def drain(self, name: str, *, requeue: bool = False) -> Drained:
        """Cordon `name` and re-place its unbound jobs; `requeue`: its running jobs too."""
        drained = self.clusters.drain(name, requeue=requeue)
        self.schedule_pass()
        if self.intake.bind_on_submit:
            self.bind_admitted()
        return drained

    def remove_cluster(self, name: str) -> None:
        """Forget a cluster added at run time (refused while it holds jobs)."""
        self.clusters.remove(name)

    # -- the mirror (`mirror.py`) --------------------------------------------------------------

    def locked(
        self, *, settles_queue: bool = False, neutral: bool = False
    ) -> AbstractContextManager[tuple[Session, Estate]]:
        """A locked store transaction and the estate, current as of it (`Mirror.locked`)."""
        return self.mirror.locked(settles_queue=settles_queue, neutral=neutral)

    def invalidate(self) -> None:
        """Forget the in-memory estate; the next transaction rebuilds it from the store."""
        self.mirror.invalidate()

    def estate(self) -> tuple[Estate, RowIds]:
        """The current estate for reads (rebuilt if the store moved); do not mutate it."""
        return self.mirror.estate()

    # -- submit, admit, bind -------------------------------------------------------------------

    def submit(self, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Validate, refuse the impossible, then queue and try to admit (or only answer)."""
        return self.intake.submit(data, dry_run=dry_run)

    def submit_many(self, items: list[dict[str, Any]], *, admit: bool = True) -> list[str]:
        """Queue many specs in one transaction (all or none), then run one admission pass."""
        return self.intake.submit_many(items, admit=admit)

    def schedule_pass(self, before: Callable[[Session], None] | None = None) -> int:
        """Admit what fits now, in queue order, in one locked transaction; returns how many
        (`CycleWriter.schedule_pass`)."""
        return self.writer.schedule_pass(before)

    @property
    def waiting(self) -> dict[tuple[str, str], int]:
        """Pending jobs per (cluster, reason code), as of the last admission pass."""
        return self.writer.waiting

    def bind_admitted(self) -> None:
        """Hand admitted jobs to their cluster's adapter; a refusal fails the job."""
        self.binder.bind_admitted()

    def reconcile(self) -> Observed:
        """Record jobs that ended (or that the backend lost), releasing their devices."""
        return self.binder.reconcile()

    def abandon(self, job_id: str, why: str) -> bool:
        """Record a running job ended (failed, `why`) without asking its cluster, which no
        longer answers: its devices and quota are free for a replacement elsewhere. The copy
        still running there, if any, is stopped once the cluster answers again (the binder
        stops what runs where its job no longer does). False: it was no longer running."""
        with self.locked() as (session, estate):
            job = session.get(Job, job_id)
            if job is None or not self.records.finish(
                session, estate, job_id, "failed", None, why, self.clock(), expect="running"
            ):
                return False
            team, cluster = job.team_name, job.cluster_name
        job_event("finished", job_id, team=team, cluster=cluster, reason=why, state="failed")
        return True

    def cancel(self, ref: str, teams: Collection[str] | None = None) -> str:
        """Cancel a pending or active job of `teams` (None: any team's; its process is
        stopped); returns its id."""
        now = self.clock()
        with self.locked() as (session, estate):
            job = job_row(session, ref, teams)
            if job.state in ("succeeded", "failed", "cancelled"):
                raise ConflictError(f"job {job.id} already ended ({job.state}); nothing to cancel")
            cluster, team = job.cluster_name, job.team_name
            self.records.finish(
                session, estate, job.id, "cancelled", None, "cancelled by a user", now
            )
            job_id = job.id
        reason = "cancelled by a user"
        job_event("cancelled", job_id, team=team, cluster=cluster, reason=reason, state="cancelled")
        self.writer.forget(job_id)
        if cluster in self.adapters:
            self.adapters[str(cluster)].release(job_id)
        return job_id

    def move(
        self, ref: str, cluster: str, node: str, resources: dict[str, Any], reason: str
    ) -> bool:
        """Re-place a pending or placed job on `node` of `cluster`, keeping its id (`moves.py`):
        its process stopped, requeued pinned there, then an admission pass. False: it already
        runs or waits there; nothing changed."""
        with self.locked() as (session, estate):
            done = move_job(
                session,
                estate,
                self.records,
                ref,
                cluster,
                node,
                resources,
                reason,
                self.mirror.ids,
            )
            if done.stop is not None:
                self.binder.stop_later([done.stop])
        if not done.moved:
            return False
        self.writer.forget(done.job_id)  # its parsed spec is the old, unpinned one
        job_event(
            "moved", done.job_id, team=done.team, cluster=cluster, reason=reason, state="pending"
        )
        self.schedule_pass()
        if self.intake.bind_on_submit:
            self.bind_admitted()
        return True


def _apply_team_config(session: Session, team: TeamConfig) -> None:
    """Apply what a `control.teams` entry states (cohort, weight, the whole set of quotas); what
    it leaves out keeps the value the API gave it (`team_edits.set_team`, `set_quota`)."""
    row = session.get(Team, team.name) or Team(name=team.name, weight=team.weight)
    if team.states("cohort"):
        row.cohort = team.cohort
    if team.states("weight"):
        row.weight = team.weight
    session.add(row)
    session.flush()
    if team.states("quotas"):
        session.execute(delete(Quota).where(Quota.team_name == team.name))
        for q in team.quotas:
            session.add(quota_row(team.name, q.flavor, q))
