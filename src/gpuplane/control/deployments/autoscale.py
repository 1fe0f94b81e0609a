"""Autoscaling's pure core: from the gateway's exact slot use and queue wait, the replicas now.

No I/O and no clock reads: the controller hands the deployment's `scaling` rules, the replicas
it wants now, how many of them serve, the gateway's last `Load` report and `now`. One decision
per call (the controller's tick), one step at a time:
- up by one as soon as the slots asked for (in flight + queued) exceed `target_slot_util` of the
  serving slots, or the oldest queued request has waited `max_queue_wait_s`, or requests wait
  with no instance at all (scale from zero); not while an instance is still starting (it is the
  step already taken), and never past `max`;
- down by one only when those slots would stay within the target on one instance fewer, nothing
  waits, `cooldown_s` has passed since the last change, and never below `min`; down to zero
  (`min: 0`) only once the model has had no request at all for `cooldown_s` (the gateway's
  exact idle time, not a sample of its load);
- otherwise, and whenever the report is older than `stale_s` (a silent gateway), unchanged.
Up needs demand > target x N slots and down needs demand < target x (N - 1) slots, so a constant
load never moves the replicas back and forth.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def decide(
    rules: Rules,
    wanted: int,
    serving: int,
    load: Load | None,
    now: float,
    last_change_at: float | None,
    stale_s: float = STALE_S,
) -> int:
    """The replicas to want now (`wanted` when nothing changes); `serving`: those of them ready
    to take requests."""
    clamped = min(max(wanted, rules.min), rules.max)
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
    fits = demand <= rules.target_slot_util * (wanted - 1) * slots
    if wanted == 1:  # to zero: no request for a whole cooldown, not just none right now
        fits = load.idle_s >= rules.cooldown_s
    if wanted > rules.min and not load.queued and cooled and fits:
        return wanted - 1
    return wanted
