"""Autoscaling's pure core: from the gateway's exact slot use and queue wait, the replicas now.

No I/O and no clock reads: the controller hands the deployment's `scaling` rules, the replicas
it wants now, how many of them serve, a `Window` of the gateways' load reports over the last
`cooldown_s` (the latest one included) and `now`. One decision per call (the controller's tick),
one step at a time:
- up by one as soon as the latest report asks for more slots (in flight + queued) than
  `target_slot_util` of the serving slots, or its oldest queued request has waited
  `max_queue_wait_s`, or requests wait with no instance at all (scale from zero); not while an
  instance is still starting (it is the step already taken), and never past `max`;
- down by one only when the reports of the whole last `cooldown_s` would leave room on one
  instance fewer, within the target, for their peak plus the same excursion above their mean
  again (`Window.clears`), nothing waited in that time, `cooldown_s` has passed since the last
  change, and never below `min`; down to zero (`min: 0`) only once the model has had no request
  at all for `cooldown_s` (the gateway's exact idle time);
- otherwise, and whenever the latest report is older than `stale_s` (a silent gateway), unchanged.
Why the margin: in-flight counts are noisy around their level (at a constant arrival rate they
are Poisson-distributed, and correlated over a request's length), and up acts on one report (a
step is served at once). A rule asking only that the window's peak fit one instance fewer scales
down whenever one cooldown happened to be calm, and back up at the next peak of the same load:
the peak of a window is a sample, the next window's exceeds it about half the time. Asking for
room for the peak plus the window's own excursion again makes a step down at a load that has not
moved rare (the benchmarks README has the figures over noise models), while a load that is exactly
steady, or whose level fell, clears it one cooldown after it settled. The default cooldown is 300
s, the scale-down stabilisation window Kubernetes' HPA defaults to: a shorter window sees too few
independent reports of a load whose requests last seconds to tell its level from its noise.
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

    def clears(self, slots: float, now: float) -> bool:
        """Whether a whole span of reports, none with a request queued, leaves room on `slots`
        for its peak demand plus its excursion above its mean demand again."""
        if self.since is None or now - self.since < self.span_s:
            return False
        recent = [r for r in self.reports if r.at >= now - self.span_s]
        if any(r.queued for r in recent):
            return False
        demands = [r.in_flight for r in recent]
        peak = max(demands)
        return 2 * peak - sum(demands) / len(demands) <= slots


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
    fits = window.clears(rules.target_slot_util * (wanted - 1) * slots, now)
    if wanted == 1:  # to zero: no request for a whole cooldown, not just none right now
        fits = load.idle_s >= rules.cooldown_s and not load.queued
    if wanted > rules.min and cooled and fits:
        return wanted - 1
    return wanted
