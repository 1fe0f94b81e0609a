"""What an admission pass works on, kept in step: the snapshot of devices, the quota book, the
admitted jobs and when their time limits end them, and what only memory holds between passes
(node nominations, completed jobs' work, when each job first waited for a faster GPU). Pure: no
SQL; the service rebuilds it from the store and `adopt`s the memory-only part of the previous one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuplane.control.admission.delay import WorkHistory
from gpuplane.control.admission.quota import Amount, QuotaBook, dominant_share
from gpuplane.control.admission.reasons import PendingReason
from gpuplane.control.scheduler import (
    Decision,
    Nomination,
    Placement,
    Request,
    Snapshot,
    blocking,
    expected_start,
    wall_seconds,
)


@dataclass(frozen=True, slots=True)
class Running:
    """An admitted job as reclaim sees it."""

    job_id: str
    team: str
    flavor: str
    priority: int
    started_at: float


@dataclass(slots=True)
class Estate:
    """What a pass works on: the snapshot, the quota book and the admitted jobs, kept in step."""

    snapshot: Snapshot
    book: QuotaBook
    running: dict[str, Running]
    flavors: dict[str, int] = field(default_factory=dict)  # GPU model -> card memory (MiB)
    clusters_of: dict[str, set[str]] = field(default_factory=dict)  # GPU model -> clusters
    capacity: Amount = field(default_factory=Amount)
    # what did not fit, by request shape: valid until capacity is freed (a release, or a
    # nomination that ends); in between free capacity only shrinks, so it still does not fit
    freed: int = 0
    shares: dict[str, float] = field(default_factory=dict)  # dominant share per team, cached
    no_fit: dict[tuple[object, ...], tuple[int, Decision, tuple[PendingReason, ...]]] = field(
        default_factory=dict
    )
    # node nominations by job id: kept across passes until the job is admitted or leaves the
    # queue; in memory only (a job that still waits earns its nomination again)
    nominated: dict[str, Nomination] = field(default_factory=dict)
    work: WorkHistory = field(default_factory=WorkHistory)  # completed jobs' work (`delay.py`)
    delayed: dict[str, float] = field(default_factory=dict)  # job id -> first waited for faster
    # admitted jobs with a time limit: job id -> when the limit ends them (wall clock, s)
    ends: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, snapshot: Snapshot, book: QuotaBook, running: Iterable[Running]) -> Estate:
        estate = cls(snapshot, book, {r.job_id: r for r in running})
        milli = mem = 0
        for node in snapshot.nodes:
            if node.devices:
                model = node.gpu_model
                estate.flavors[model] = max(
                    estate.flavors.get(model, 0), max(d.mem_mib for d in node.devices)
                )
                estate.clusters_of.setdefault(model, set()).add(node.cluster)
                milli += 1000 * len(node.devices)
                mem += sum(d.mem_mib for d in node.devices)
        estate.capacity = Amount(milli, mem)
        return estate

    def copy(self) -> Estate:
        other = Estate(self.snapshot.copy(), self.book.copy(), dict(self.running))
        other.flavors, other.clusters_of, other.capacity = (
            self.flavors,
            self.clusters_of,
            self.capacity,
        )
        other.nominated = dict(self.nominated)
        other.work, other.delayed, other.ends = self.work, dict(self.delayed), dict(self.ends)
        return other

    def adopt(self, previous: Estate) -> None:
        """Keep what only memory holds after a rebuild: `previous`'s nominations of nodes this
        estate still has, and its work history."""
        self.nominated = {
            j: h for j, h in previous.nominated.items() if h.node in self.snapshot.index
        }
        self.work, self.delayed = previous.work, previous.delayed

    def end_nomination(self, job_id: str) -> None:
        """End `job_id`'s node nomination, if it holds one. Idempotent."""
        if self.nominated.pop(job_id, None) is not None:
            self.freed += 1

    def nominations_against(self, request: Request, now: float) -> list[Nomination]:
        """What the node nominations keep from `request`: all of them but its own and those
        its time limit lets it backfill (the scheduler's `blocking`)."""
        others = [h for j, h in self.nominated.items() if j != request.job_id]
        return blocking(self.snapshot, others, request, now) if others else others

    def nomination(self, node: str, request: Request, now: float) -> Nomination:
        """A nomination of `node` for `request`, with its expected start by the time limits of the
        node's jobs (the scheduler's `expected_start`)."""
        snap = self.snapshot
        jobs = snap.placements_on(node)
        start = expected_start(snap, snap.index[node], request, jobs, self.ends, now)
        return Nomination(node, request, start)

    def admitted(self, placement: Placement, time_limit_s: float | None, now: float) -> None:
        """Note when a job just placed at `placement` ends by its time limit, if it has one."""
        if time_limit_s is not None:
            speed = self.snapshot.speed_of(placement.node)
            self.ends[placement.job_id] = now + wall_seconds(time_limit_s, speed)

    def expected_ends(self) -> dict[str, list[tuple[float, int]]]:
        """Per GPU model, when each running job with a time limit is expected to end and the
        milli-GPUs it holds: its start plus the share of its limit that completed jobs used
        (`WorkHistory.limit_fill`)."""
        fill = self.work.limit_fill()
        snap = self.snapshot
        out: dict[str, list[tuple[float, int]]] = {}
        for job_id, end in self.ends.items():
            running, placement = self.running.get(job_id), snap.allocations.get(job_id)
            if running is None or placement is None:
                continue
            at = running.started_at + fill * (end - running.started_at)
            out.setdefault(snap.model_of(placement.node), []).append((at, placement.gpu_milli))
        return out

    def release(self, job_id: str, ended_at: float | None = None) -> None:
        """Give back a job's devices, quota and node nomination. Idempotent. `ended_at`: the
        job completed then (its run time, cards' speed and time limit feed `work`)."""
        running, placement = self.running.get(job_id), self.snapshot.allocations.get(job_id)
        if ended_at is not None and running is not None and placement is not None:
            limit_end = self.ends.get(job_id)
            self.work.observe(
                ended_at - running.started_at,
                self.snapshot.speed_of(placement.node),
                None if limit_end is None else limit_end - running.started_at,
            )
        held = self.book.reservation(job_id)
        if held is not None:
            self.shares.pop(held[0], None)
        self.snapshot.release(job_id)
        self.book.release(job_id)
        self.running.pop(job_id, None)
        self.ends.pop(job_id, None)
        self.end_nomination(job_id)
        self.freed += 1

    def share(self, team: str) -> float:
        """The team's dominant-resource share (over its weight), cached until it changes."""
        value = self.shares.get(team)
        if value is None:
            value = dominant_share(
                self.book.team_total(team), self.capacity, self.book.team(team).weight
            )
            self.shares[team] = value
        return value
