"""The election core on a simulated clock: a leader and a standby claiming one lease through
a store with latency, with the leader's renewals held up as on a CPU-starved host.

Checked at every event: never two gateways admitting at once (by the true time, which the
store also keeps), and, over 30 simulated minutes at 200 ms store latency and 90 % CPU, no
change of leader at all; a leader paused past its lease stops on its own before the standby
takes over, and comes back as a standby.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from gpuplane.serve.ha.lease import (
    Change,
    Election,
    Fenced,
    LeaseRecord,
    answer,
    check_epoch,
    take,
)
from gpuplane.serve.ha.settings import HaConfig

CFG = HaConfig()  # the defaults: ttl 1.5 s, renew 0.25 s, stop margin 0.25 s


@dataclass
class Sim:
    """Events on one true clock; the store decides a claim when it arrives."""

    rng: random.Random
    latency_s: float
    now: float = 0.0
    record: LeaseRecord | None = None
    events: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.seq), action))

    def one_way(self) -> float:
        """Half a round trip: the store latency split, with some spread."""
        return self.latency_s / 2 * self.rng.uniform(0.5, 1.5)

    def run(self, until: float, check: Callable[[], None]) -> None:
        while self.events and self.events[0][0] <= until:
            self.now, _, action = heapq.heappop(self.events)
            action()
            check()


@dataclass
class Gateway:
    name: str
    sim: Sim
    delay: Callable[[], float]  # how late the loop's next claim starts (CPU starvation)
    election: Election = field(init=False)
    paused_until: float = 0.0
    elected: int = 0

    def __post_init__(self) -> None:
        self.election = Election(self.name, CFG.stop_margin_s)

    def admits(self) -> bool:
        return self.election.can_admit(self.sim.now) is None

    def start(self) -> None:
        self.sim.at(self.sim.now, self.claim)

    def claim(self) -> None:
        sim = self.sim
        if sim.now < self.paused_until:  # a stopped process resumes where it stood
            sim.at(self.paused_until, self.claim)
            return
        sent = sim.now

        def arrive() -> None:
            sim.record = take(sim.record, self.name, None, sim.now, CFG.lease_ttl_s)
            lease = answer(sim.record, sim.now)
            sim.at(sim.now + sim.one_way(), lambda: self.answered(sent, lease))

        sim.at(sent + sim.one_way(), arrive)

    def answered(self, sent: float, lease: object) -> None:
        sim = self.sim
        if sim.now < self.paused_until:
            sim.at(self.paused_until, lambda: self.answered(sent, lease))
            return
        assert lease is not None
        if self.election.answered(sent, lease, sim.now) is Change.ELECTED:  # type: ignore[arg-type]
            self.elected += 1
            assert self.election.epoch is not None
            self.election.rebuilt(self.election.epoch)
        next_at = self.election.next_claim_at(sent, CFG.renew_s)
        sim.at(max(sim.now, next_at) + self.delay(), self.claim)


def _starved(rng: random.Random) -> Callable[[], float]:
    """Scheduling delays of a loop on a host at 90 % CPU: mostly a few ms, one in fifty
    200 ms, one in a thousand 600 ms."""

    def delay() -> float:
        x = rng.random()
        if x < 0.001:
            return 0.6
        if x < 0.02:
            return 0.2
        return rng.expovariate(1 / 0.01)

    return delay


def _never_two(gateways: list[Gateway]) -> Callable[[], None]:
    def check() -> None:
        admitting = [g.name for g in gateways if g.admits()]
        assert len(admitting) <= 1, f"two gateways admit at {gateways[0].sim.now:.3f}: {admitting}"

    return check


def test_thirty_minutes_of_slow_store_and_starved_cpu_change_no_leader() -> None:
    for seed in range(3):
        rng = random.Random(seed)
        sim = Sim(rng, latency_s=0.2)
        a = Gateway("a", sim, _starved(rng))
        b = Gateway("b", sim, _starved(rng))
        a.start()
        sim.run(0.5, lambda: None)
        b.start()
        sim.run(30 * 60.0, _never_two([a, b]))
        assert (a.elected, b.elected) == (1, 0), f"seed {seed}: leader changed"
        assert sim.record is not None
        assert sim.record.epoch == 1


def test_a_leader_paused_past_its_lease_stops_before_the_standby_takes_over() -> None:
    rng = random.Random(7)
    sim = Sim(rng, latency_s=0.2)
    a = Gateway("a", sim, lambda: 0.0)
    b = Gateway("b", sim, lambda: 0.0)
    a.start()
    sim.run(0.5, lambda: None)
    b.start()
    sim.run(5.0, _never_two([a, b]))
    assert a.admits()
    assert not b.admits()
    a.paused_until = 5.0 + 4.0  # SIGSTOP for 4 s, then SIGCONT
    stopped_at: list[float] = []

    def watch() -> None:
        _never_two([a, b])()
        if not a.admits() and not stopped_at:
            stopped_at.append(sim.now)

    sim.run(8.9, watch)
    assert b.admits()  # took over while a was stopped
    assert stopped_at
    assert stopped_at[0] <= 5.0 + CFG.lease_ttl_s
    sim.run(15.0, _never_two([a, b]))
    assert not a.admits()  # after SIGCONT it finds the lease taken: a standby now
    assert b.election.epoch == 2
    assert a.election.epoch is None


def test_a_claim_answered_after_its_own_deadline_does_not_lead() -> None:
    e = Election("a", stop_margin_s=0.25)
    lease = answer(take(None, "a", None, 0.0, 1.5), 0.0)
    assert e.answered(0.0, lease, now=1.3) is Change.NONE  # 0 + 1.5 - 0.25 has passed
    assert e.can_admit(1.3) is not None


def test_admitting_waits_for_the_rebuild_of_the_epoch() -> None:
    e = Election("a", stop_margin_s=0.25)
    lease = answer(take(None, "a", None, 0.0, 1.5), 0.0)
    assert e.answered(0.0, lease, now=0.01) is Change.ELECTED
    assert e.can_admit(0.01) is not None
    e.rebuilt(lease.epoch)
    assert e.can_admit(0.01) is None
    assert e.can_admit(1.25) is not None  # the deadline passed unrenewed
    assert e.expire(1.25) is Change.LOST


def test_the_epoch_grows_on_every_change_of_holder_and_an_older_write_is_refused() -> None:
    r = take(None, "a", None, 0.0, 1.0)
    assert take(r, "a", None, 0.5, 1.0).epoch == r.epoch  # renewed
    assert take(r, "b", None, 0.5, 1.0) == r  # held by a: unchanged
    r2 = take(r, "b", None, 1.1, 1.0)
    assert (r2.holder, r2.epoch) == ("b", r.epoch + 1)
    r3 = take(r2, "b", None, 2.5, 1.0)  # b lost it and took it back: a new epoch too
    assert r3.epoch == r2.epoch + 1
    check_epoch(r3.epoch, r3.epoch)
    with pytest.raises(Fenced, match=f"epoch {r.epoch} was refused"):
        check_epoch(r3.epoch, r.epoch)


@pytest.mark.parametrize("seed", range(5))
def test_a_standby_claims_the_moment_a_dead_leaders_lease_runs_out(seed: int) -> None:
    """Not on its next tick: it leads within a round trip of the dead leader's lease running
    out by the store's clock (the ticks alone would add up to `renew_s`)."""
    rng = random.Random(seed)
    sim = Sim(rng, latency_s=0.02)
    a = Gateway("a", sim, lambda: 0.0)
    b = Gateway("b", sim, lambda: 0.0)
    a.start()
    sim.run(0.5, lambda: None)
    b.start()
    sim.run(3.0 + rng.random(), _never_two([a, b]))
    a.paused_until = math.inf  # SIGKILL
    seen: dict[str, float] = {}

    def watch() -> None:
        _never_two([a, b])()
        if sim.record is not None and sim.record.holder == "a":
            seen["a_runs_out"] = sim.record.expires_at
        if b.admits():
            seen.setdefault("b_leads", sim.now)

    sim.run(sim.now + 3 * CFG.lease_ttl_s, watch)
    # the claim leaves when the answer's ttl is up, goes and comes back: three one-way trips of
    # at most 0.75 of the latency each
    assert seen["b_leads"] - seen["a_runs_out"] <= 3 * 0.75 * sim.latency_s
