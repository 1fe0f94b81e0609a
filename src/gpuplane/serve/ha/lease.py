"""The leader lease and one gateway's election, on an injected clock: pure, no I/O.

A lease store answers every claim with the lease as it then stands: who holds it, in which
epoch, and for how much longer by the store's own clock. The epoch grows every time the lease
is taken after it was free or had run out, so it grows on every change of holder and a holder
that lost it and took it back is in a new epoch too. Every write a leader makes to shared
state carries its epoch, and a store refuses a write whose epoch is older than the lease's
(`Fenced`).

`Election` turns those answers into one gateway's role. It counts its own lease from the
moment it *sent* the claim, which is no later than the store started counting, and stops
`stop_margin_s` before even that runs out: a leader that cannot renew (the store is slow or
unreachable, its process was paused) stops admitting on its own before any standby can take
over, without waiting to hear from anyone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from gpuplane.errors import GpuplaneError


class StoreUnavailable(GpuplaneError):
    """The lease store did not answer (unreachable, timed out, refused the connection)."""


class Fenced(GpuplaneError):
    """A write to shared state carried an epoch older than the lease's: a newer leader exists."""


@dataclass(frozen=True, slots=True)
class LeaderLease:
    """The lease as the store answered a claim."""

    holder: str
    epoch: int
    ttl_s: float  # how long it still runs by the store's clock, as of the answer
    url: str | None = None  # where the holder serves, for standbys that forward to it


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The lease as a store that keeps it as plain data holds it (file, PostgreSQL)."""

    holder: str
    epoch: int
    expires_at: float  # on the store's clock
    url: str | None = None


def take(
    current: LeaseRecord | None, holder: str, url: str | None, now: float, ttl_s: float
) -> LeaseRecord:
    """The record after `holder` claims at `now` (the store's clock): renewed while it holds
    it, taken in the next epoch when it is free or has run out, else unchanged."""
    if current is not None and current.expires_at > now:
        if current.holder != holder:
            return current
        return LeaseRecord(holder, current.epoch, now + ttl_s, url)
    epoch = current.epoch + 1 if current is not None else 1
    return LeaseRecord(holder, epoch, now + ttl_s, url)


def released(
    current: LeaseRecord | None, holder: str, epoch: int, now: float
) -> LeaseRecord | None:
    """The record after `holder` gives up epoch `epoch`: run out now (the epoch stays, so the
    next holder's is higher); anything else is left as it is (a release is idempotent)."""
    if current is None or current.holder != holder or current.epoch != epoch:
        return current
    return LeaseRecord(current.holder, current.epoch, min(current.expires_at, now), current.url)


def answer(record: LeaseRecord, now: float) -> LeaderLease:
    return LeaderLease(record.holder, record.epoch, record.expires_at - now, record.url)


def check_epoch(lease_epoch: int, write_epoch: int) -> None:
    """Refuse a write in an epoch older than the lease's (`Fenced`)."""
    if write_epoch < lease_epoch:
        raise Fenced(
            f"a write in epoch {write_epoch} was refused: the lease is in epoch {lease_epoch}, "
            "so another gateway has led since; this gateway stops admitting"
        )


class Change(StrEnum):
    """What an answer changed about this gateway's role."""

    NONE = "none"
    ELECTED = "elected"  # leads in a new epoch: rebuild the slot table before admitting
    LOST = "lost"  # led until now and no longer does


class NotAdmitting(StrEnum):
    """Why this gateway does not admit a request now."""

    STANDBY = "standby"  # another gateway leads (or none is known)
    REBUILDING = "rebuilding"  # leads, but has not rebuilt its slot table yet


@dataclass(slots=True)
class Election:
    """One gateway's role, from the answers of its lease store.

    Callers: the lease loop calls `answered` after each claim (with the time it sent it, or a
    None lease when the store did not answer) and `rebuilt` once the slot table is rebuilt for
    the epoch; the request path asks `can_admit(now)` before every admission.
    """

    holder: str
    stop_margin_s: float
    epoch: int | None = None  # the epoch this gateway leads in, while it thinks it may
    deadline: float = -math.inf  # local time this gateway stops admitting unless renewed
    rebuilt_epoch: int | None = None
    leader: LeaderLease | None = None  # the latest lease the store answered
    # local time another holder's lease has run out by, at the latest (its ttl counted from
    # when the answer arrived, which is after the store counted it)
    leader_until: float = -math.inf

    def leading(self, now: float) -> bool:
        return self.epoch is not None and now < self.deadline

    def can_admit(self, now: float) -> NotAdmitting | None:
        """None when this gateway may admit a request now, else why not."""
        if not self.leading(now):
            return NotAdmitting.STANDBY
        if self.rebuilt_epoch != self.epoch:
            return NotAdmitting.REBUILDING
        return None

    def answered(self, sent_at: float, lease: LeaderLease | None, now: float) -> Change:
        """The store answered a claim sent at `sent_at` with `lease` (None: no answer)."""
        if lease is None:  # nothing learnt: lead on until the deadline at most
            return self.expire(now)
        self.leader, self.leader_until = lease, now + lease.ttl_s
        if lease.holder == self.holder:
            deadline = sent_at + lease.ttl_s - self.stop_margin_s
            if now < deadline:
                # the same epoch means the lease never ran out: nobody else led meanwhile
                new_term = lease.epoch != self.epoch
                self.epoch, self.deadline = lease.epoch, deadline
                return Change.ELECTED if new_term else Change.NONE
        lost = self.epoch is not None
        self.epoch, self.deadline = None, -math.inf
        return Change.LOST if lost else Change.NONE

    def next_claim_at(self, sent_at: float, renew_s: float) -> float:
        """When to claim next after the claim sent at `sent_at`: `renew_s` later, and a standby
        no later than the moment the leader's lease runs out by the store's clock, so that it
        takes over then rather than on its next tick (a claim there never comes early: the
        lease is counted from when its answer arrived)."""
        if self.leader is None or self.leader.holder == self.holder:
            return sent_at + renew_s
        return min(sent_at + renew_s, self.leader_until)

    def expire(self, now: float) -> Change:
        """Past the deadline with no renewal: this gateway no longer leads (idempotent)."""
        if self.epoch is not None and not self.leading(now):
            self.epoch, self.deadline = None, -math.inf
            return Change.LOST
        return Change.NONE

    def fence(self) -> Change:
        """Stop leading now: the store refused a write as fenced, or this gateway steps down."""
        lost = self.epoch is not None
        self.epoch, self.deadline = None, -math.inf
        return Change.LOST if lost else Change.NONE

    def rebuilt(self, epoch: int) -> None:
        """The slot table was rebuilt for `epoch`; admitting may start if it is still current."""
        self.rebuilt_epoch = epoch
