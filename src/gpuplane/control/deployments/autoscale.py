"""Autoscaling's pure core: from the gateway's exact slot use and queue wait, the replicas now.

No I/O and no clock reads: the controller hands the deployment's `scaling` rules, the replicas
it wants now, how many of them serve, a `Window` of the gateways' load reports over the last
`cooldown_s` (the latest one included) and `now`. One decision per call (the controller's tick),
one step at a time:
- up by one as soon as the latest report asks for more slots (in flight + queued) than
  `target_slot_util` of the serving slots, or its oldest queued request has waited
  `max_queue_wait_s`, or requests wait with no instance at all (scale from zero); not while an
  instance is still starting (it is the step already taken), and never past `max`;
- down by one only when the highest demand reported over the whole last `cooldown_s` would have
  stayed within the target on one instance fewer and nothing waited in that time, `cooldown_s`
  has passed since the last change, and never below `min`; down to zero (`min: 0`) only once
  the model has had no request at all for `cooldown_s` (the gateway's exact idle time);
- otherwise, and whenever the latest report is older than `stale_s` (a silent gateway), unchanged.
Why the window: in-flight counts are noisy around their level (at a constant arrival rate they
are Poisson-distributed), and a rule acting on one report scales down on every dip and back up on
the next peak. Up acts on one report (a step is served at once); down asks that the load *stayed*
low, so the peak that caused a step up keeps the replicas for a whole cooldown after it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

STALE_S = 10.0  # a load report older than this is not acted on


@dataclass(frozen=True, slots=True)
class Load:
    """A gateway's report for one deployment's model: slots held, requests waiting in its fair
    queue and the longest wait among them, at `at` (on the control plane's clock); `idle_s`:
    how long it has had no request in flight or queued (0 while it has one)."""

    in_flight: int
    queued: int
    oldest_wait_s: float
    at: float
    idle_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Rules:
    min: int
    max: int
    target_slot_util: float
    max_queue_wait_s: float
    cooldown_s: float
    slots_per_instance: int


@dataclass(slots=True)
class Window:
    """The load reports of the last `span_s` seconds (a deployment's `cooldown_s`), oldest
    first. Pure: the controller (or a simulation) adds each report it acts on; `since` is when
    the first was added, so a window younger than its span is known to be one."""

    span_s: float
    reports: deque[Load] = field(default_factory=deque)
    since: float | None = None

    def add(self, load: Load) -> None:
        """Add a report; one not newer than the latest (the same report seen again) is ignored."""
        if self.reports and load.at <= self.reports[-1].at:
            return
        self.since = load.at if self.since is None else self.since
        self.reports.append(load)
        while self.reports[0].at < load.at - self.span_s:
            self.reports.popleft()

    @property
    def latest(self) -> Load | None:
        return self.reports[-1] if self.reports else None

    def stayed_within(self, slots: float, now: float) -> bool:
        """Whether every report of the last `span_s` (a whole span of them) asked for at most
        `slots` slots with nothing queued."""
        if self.since is None or now - self.since < self.span_s:
            return False
        recent = [r for r in self.reports if r.at >= now - self.span_s]
        return all(r.queued == 0 and r.in_flight <= slots for r in recent)


def decide(
    rules: Rules,
    wanted: int,
    serving: int,
    window: Window,
    now: float,
    last_change_at: float | None,
    stale_s: float = STALE_S,
) -> int:
    """The replicas to want now (`wanted` when nothing changes); `serving`: those of them ready
    to take requests; `window`: the load reports of the last `rules.cooldown_s`."""
    clamped = min(max(wanted, rules.min), rules.max)
    load = window.latest
    if clamped != wanted or load is None or now - load.at > stale_s:
        return clamped
    demand = load.in_flight + load.queued
    slots = rules.slots_per_instance
    if serving < wanted:  # a step is under way: wait until its instance serves
        return wanted
    busy = demand > rules.target_slot_util * serving * slots
    waited = load.queued > 0 and load.oldest_wait_s >= rules.max_queue_wait_s
    if (busy or waited or (serving == 0 and demand > 0)) and wanted < rules.max:
        return wanted + 1
    cooled = last_change_at is None or now - last_change_at >= rules.cooldown_s
    fits = window.stayed_within(rules.target_slot_util * (wanted - 1) * slots, now)
    if wanted == 1:  # to zero: no request for a whole cooldown, not just none right now
        fits = load.idle_s >= rules.cooldown_s and not load.queued
    if wanted > rules.min and cooled and fits:
        return wanted - 1
    return wanted
