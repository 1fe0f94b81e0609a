"""The deployment reconciler's pure core: from what is wanted and what runs, what to do now.

No I/O and no clock: the caller hands `now` and each version's earliest next start (the crash
back-off), and carries out the `Plan` (`controller.py`). Rules, per deployment:
- an instance whose job ended is forgotten; one that ended while still wanted crashed, and its
  version's next start waits out a back-off (the caller's `Backoff`);
- an instance whose job runs where the control plane no longer reaches (its cluster stopped
  answering: a lost node or cluster) is lost: the caller records its job ended without asking
  the cluster, which frees its slice and quota, and it drains; it neither serves nor counts, so
  its replacement starts now, elsewhere (it did not crash: no back-off);
- the wanted versions are the spec's `version` and, during a rollout, its canaries'; a version
  no longer wanted (replaced, promoted from, rolled back) drains every instance: at once when
  the deployment is deleted, else once every wanted version serves its replicas (running, and
  ready in every gateway that reports: new instances start beside the old ones, so traffic
  always has somewhere to go); a version with more instances
  than its replicas drains the surplus, those not yet running first (they hold no requests),
  then one on the cluster holding the most of that version's instances (so a scale-down, or
  the end of a move, keeps them spread), then an idle one (no slot held in any gateway's
  report: its drain ends at once), then the newest;
- a draining instance that never ran is stopped at once; one that ran is stopped once the
  gateways report that they released it (its last lease ended), or `drain_timeout_s` after it
  began to drain, which lets the gateways finish their requests there first;
- a version with fewer instances than its replicas starts the missing ones, unless its back-off
  has not yet passed;
- without `surge` (replace in place, for an estate with no spare slice), an old version is
  replaced one instance at a time: no more instances than the replicas wanted, counting the old
  and the draining ones, and one old instance drains once none drains and every new one
  placed serves (one still pending, waiting for a slice, does not hold it back); the new one
  starts once the old one has stopped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

ENDED = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class Instance:
    """An instance as the reconciler sees it: its job's state and when it began to drain."""

    job_id: str
    version: str
    job_state: str  # pending | admitted | running | succeeded | failed | cancelled
    created_at: float
    draining_since: float | None = None
    lost: str | None = None  # why the control plane no longer reaches where its job runs
    cluster: str | None = None  # where its job was placed (None: not yet)

    @property
    def ended(self) -> bool:
        return self.job_state in ENDED

    @property
    def running(self) -> bool:
        return self.job_state == "running"


@dataclass(frozen=True, slots=True)
class Want:
    """What one deployment wants: per version, its instances (several versions during a
    rollout; none when deleted)."""

    versions: Mapping[str, int]
    drain_timeout_s: float
    surge: bool = True  # False: replace an old version in place, one instance at a time


@dataclass(slots=True)
class Plan:
    forget: list[str] = field(default_factory=list)  # ended: drop the record
    crashed: list[Instance] = field(default_factory=list)  # ended while wanted
    lost: list[Instance] = field(default_factory=list)  # record ended, drain; no stop to send
    drain: list[str] = field(default_factory=list)  # no new requests from now
    stop: list[str] = field(default_factory=list)  # stop its job now
    start: dict[str, int] = field(default_factory=dict)  # new instances per wanted version
    waiting_until: float | None = None  # a start waits for the back-off until then

    @property
    def changes(self) -> bool:
        return bool(self.forget or self.lost or self.drain or self.stop or self.start)


def plan(
    want: Want,
    instances: Sequence[Instance],
    now: float,
    next_start: Mapping[str, float] | None = None,
    released: Collection[str] = (),
    ready: Collection[str] | None = None,
    held: Mapping[str, int] | None = None,
) -> Plan:
    """What to do now for one deployment; `next_start[version]`: its crash back-off's end;
    `released`: draining instances that no gateway holds any more (their last lease ended);
    `ready`: the instances the gateways admit to (None: no gateway reports; a running job
    counts as serving); `held`: the slots the gateways hold on each instance (None: no
    gateway reports)."""
    out = Plan()
    live: dict[str, list[Instance]] = {v: [] for v in want.versions}
    old: list[Instance] = []
    draining = 0  # instances that drain and still hold their slice
    for inst in instances:
        if inst.ended:
            out.forget.append(inst.job_id)
            if inst.draining_since is None:
                out.crashed.append(inst)
        elif inst.lost is not None:
            out.lost.append(inst)
        elif inst.draining_since is not None:
            draining += 1
            timed_out = now - inst.draining_since >= want.drain_timeout_s
            if not inst.running or inst.job_id in released or timed_out:
                out.stop.append(inst.job_id)
        elif inst.version not in want.versions:
            old.append(inst)
        else:
            live[inst.version].append(inst)

    def serves(version: str) -> bool:
        up = [i for i in live[version] if i.running and (ready is None or i.job_id in ready)]
        return len(up) >= want.versions[version]

    if all(serves(v) for v in want.versions):  # none wanted (deleted): at once
        for inst in old:
            _drain(out, inst, now)
        old = []
    # in place: no more instances than wanted, counting the old and the draining ones; one
    # old instance drains once nothing else does and every new one started serves
    room = None
    if not want.surge and old:
        room = sum(want.versions.values()) - sum(map(len, live.values())) - len(old) - draining
        # a new instance waiting for a slice (pending) does not hold the next drain back
        settled = all(
            i.job_state == "pending" or (i.running and (ready is None or i.job_id in ready))
            for v in live.values()
            for i in v
        )
        if room <= 0 and not draining and settled:
            _drain(out, min(old, key=lambda i: i.created_at), now)
    for version, replicas in want.versions.items():
        surplus = len(live[version]) - replicas
        if surplus > 0:
            for inst in _drain_order(live[version], held)[:surplus]:
                _drain(out, inst, now)
        elif surplus < 0:
            if any(i.version == version for i in out.crashed):
                continue  # the caller counts the crash first; the next round starts it
            until = (next_start or {}).get(version)
            if until is not None and now < until:
                out.waiting_until = min(until, out.waiting_until or until)
            elif room is None:
                out.start[version] = -surplus
            elif room > 0:
                out.start[version] = min(-surplus, room)
                room -= out.start[version]
    return out


def _drain_order(live: list[Instance], held: Mapping[str, int] | None) -> list[Instance]:
    """A version's instances in the order its surplus drains: not yet running first (they hold
    no requests), then from the most crowded cluster, then idle ones, then the newest."""
    crowd = Counter(i.cluster for i in live)
    busy = held or {}
    return sorted(
        live,
        key=lambda i: (i.running, -crowd[i.cluster], busy.get(i.job_id, 0) > 0, -i.created_at),
    )


def _drain(out: Plan, inst: Instance, now: float) -> None:
    out.drain.append(inst.job_id)
    if not inst.running:  # it never took a request: nothing to wait for
        out.stop.append(inst.job_id)
