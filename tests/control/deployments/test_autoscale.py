"""Autoscaling's pure core on a fake clock: one tick to react, one step at a time, scale-down
only when one instance fewer holds a whole cooldown's peak plus its excursion again, and no
oscillation at constant load, exact or noisy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuplane.control.deployments.autoscale import Load, Rules, Window, decide
from gpuplane.control.deployments.spec import ScalingSpec

RULES = Rules(
    min=1, max=5, target_slot_util=0.7, max_queue_wait_s=5.0, cooldown_s=60.0, slots_per_instance=4
)


def load(in_flight: int, queued: int = 0, wait: float = 0.0, at: float = 0.0) -> Load:
    return Load(in_flight, queued, wait, at)


def seen(*loads: Load, rules: Rules = RULES) -> Window:
    """A window holding `loads`, in order."""
    window = Window(rules.cooldown_s)
    for one in loads:
        window.add(one)
    return window


def steady(in_flight: int, until: float, every: float = 1.0) -> Window:
    """Reports of `in_flight` slots every `every` s from 0 to `until`."""
    n = int(until / every)
    return seen(*(load(in_flight, at=i * every) for i in range(n + 1)))


def test_up_at_the_first_tick_past_the_target() -> None:
    assert decide(RULES, 2, 2, seen(load(5)), now=0.0, last_change_at=None) == 2  # 5 <= 5.6
    assert decide(RULES, 2, 2, seen(load(6)), now=0.0, last_change_at=None) == 3  # 6 > 5.6


def test_a_step_up_is_decided_on_its_first_report_whatever_the_window_held() -> None:
    window = steady(2, until=300.0)  # five quiet minutes, then the step
    window.add(load(9, at=301.0))
    assert decide(RULES, 2, 2, window, now=301.0, last_change_at=0.0) == 3


def test_up_when_the_oldest_request_waited_too_long() -> None:
    assert decide(RULES, 3, 3, seen(load(4, 1, wait=4.9)), 0.0, None) == 3
    assert decide(RULES, 3, 3, seen(load(4, 1, wait=5.0)), 0.0, None) == 4


def test_from_zero_when_a_request_waits() -> None:
    zero = Rules(0, 3, 0.7, 5.0, 60.0, 4)
    assert decide(zero, 0, 0, seen(load(0), rules=zero), 0.0, None) == 0
    assert decide(zero, 0, 0, seen(load(0, 1), rules=zero), 0.0, None) == 1


def test_one_step_at_a_time_while_an_instance_starts() -> None:
    assert decide(RULES, 3, 2, seen(load(8, 10, wait=9.0)), 0.0, None) == 3
    assert decide(RULES, 3, 3, seen(load(8, 10, wait=9.0)), 0.0, None) == 4


def test_never_past_max_or_below_min() -> None:
    assert decide(RULES, 5, 5, seen(load(20, 50, wait=30.0)), 0.0, None) == 5
    assert decide(RULES, 1, 1, steady(0, until=1000.0), 1000.0, None) == 1
    assert decide(RULES, 9, 9, seen(load(0)), 0.0, None) == 5  # the rules changed: clamped at once


def test_down_only_when_the_load_stayed_within_one_fewer_for_a_whole_cooldown() -> None:
    # 3 instances, 12 slots; one fewer keeps 8 slots, 5.6 of them within the target
    assert decide(RULES, 3, 3, steady(6, until=100.0), 100.0, last_change_at=0.0) == 3
    assert decide(RULES, 3, 3, steady(5, until=100.0), 100.0, last_change_at=0.0) == 2
    assert decide(RULES, 3, 3, steady(5, until=59.0), 59.0, last_change_at=None) == 3  # too young
    assert decide(RULES, 3, 3, steady(5, until=100.0), 100.0, last_change_at=50.0) == 3  # cooling
    queued_once = steady(5, until=100.0)
    queued_once.reports[-30] = load(2, 1, at=queued_once.reports[-30].at)
    assert decide(RULES, 3, 3, queued_once, 100.0, last_change_at=0.0) == 3


def test_down_only_with_room_for_the_peak_and_its_excursion_again() -> None:
    """5 and 3 in turn: the peak (5) fits the 5.6 slots two instances hold within the target,
    but a load that swings 1 above its mean may next swing 2 above it (6): three stay. Exactly
    5 leaves (2 instances)."""
    swinging = seen(*(load(5 if i % 2 else 3, at=float(i)) for i in range(101)))
    assert decide(RULES, 3, 3, swinging, 100.0, last_change_at=0.0) == 3
    assert decide(RULES, 3, 3, steady(5, until=100.0), 100.0, last_change_at=0.0) == 2
    calmer = seen(*(load(4 if i % 4 == 0 else 5, at=float(i)) for i in range(101)))
    assert decide(RULES, 3, 3, calmer, 100.0, last_change_at=0.0) == 2  # 5 + 0.25 <= 5.6


def test_one_peak_in_the_last_cooldown_keeps_the_replicas() -> None:
    window = steady(5, until=100.0)
    window.reports[-50] = load(7, at=51.0)  # 49 s ago: too much for 2 instances
    assert decide(RULES, 3, 3, window, 100.0, last_change_at=0.0) == 3
    for at in range(101, 112):  # the peak stays in the window for 60 s
        window.add(load(5, at=float(at)))
    assert decide(RULES, 3, 3, window, 111.0, last_change_at=0.0) == 3
    window.add(load(5, at=112.0))
    assert decide(RULES, 3, 3, window, 112.0, last_change_at=0.0) == 2


def test_a_real_drop_scales_down_one_step_per_cooldown() -> None:
    """From 12 in flight on 5 instances to 2: down to 1, each step a cooldown after the last."""
    window = steady(12, until=120.0)
    wanted, changed, steps = 5, 0.0, []
    for now in itertools.count(121):
        window.add(load(2, at=float(now)))
        new = decide(RULES, wanted, wanted, window, float(now), changed)
        if new != wanted:
            steps.append((now, new))
            wanted, changed = new, float(now)
        if wanted == 1 or now > 1000:
            break
    assert steps == [(181, 4), (241, 3), (301, 2), (361, 1)]


def test_a_silent_gateway_changes_nothing() -> None:
    assert decide(RULES, 3, 3, seen(load(0, at=0.0)), now=11.0, last_change_at=None) == 3
    assert decide(RULES, 3, 3, Window(60.0), now=11.0, last_change_at=None) == 3


def _moves(
    in_flight: list[int], start: int, ready_after: float = 3.0, rules: Rules = RULES
) -> list[int]:
    """The replicas' steps over one report a second of `in_flight` (asked for), from `start`
    serving; an instance serves `ready_after` s after its decision."""
    window = Window(rules.cooldown_s)
    wanted, serving, changed, moves = start, start, None, []
    starts: list[float] = []
    for now, demand in enumerate(in_flight):
        serving += sum(1 for s in starts if s <= now)
        starts = [s for s in starts if s > now]
        slots = serving * rules.slots_per_instance
        queued = max(0, demand - slots)
        window.add(load(demand - queued, queued, 10.0 if queued else 0.0, at=float(now)))
        new = decide(rules, wanted, serving, window, float(now), changed)
        if new != wanted:
            moves.append(new - wanted)
            if new > wanted:
                starts.append(now + ready_after)
            else:
                serving = new
            wanted, changed = new, float(now)
    return moves


@pytest.mark.parametrize("in_flight", range(21))
def test_no_oscillation_at_exactly_constant_load(in_flight: int) -> None:
    """30 simulated minutes from every starting size: the replicas move one way only."""
    for start in range(RULES.min, RULES.max + 1):
        moves = _moves([in_flight] * 1800, start)
        assert len(set(moves)) <= 1, (start, moves)


@pytest.mark.parametrize("level", [2, 5, 8])
def test_no_direction_change_under_noise_around_a_constant_level(level: int) -> None:
    """Demand drawn around its level each second (uniform, at most 2 either side): 10
    simulated minutes from 1 instance; the replicas only go up, then stay."""
    rng = np.random.default_rng(level)
    demand = [int(d) for d in level + rng.integers(-2, 3, size=600)]
    moves = _moves(demand, 1)
    assert moves, "the level takes more than one instance"
    assert set(moves) == {1}, moves


@pytest.mark.parametrize("level", [3, 6, 9])
def test_no_direction_change_at_a_poisson_load_with_the_default_cooldown(level: int) -> None:
    """In-flight counts of a constant arrival rate (Poisson around the level, one report a
    second), 30 simulated minutes from 1 instance, the spec's default cooldown (300 s), three
    seeds: the replicas only go up, then stay. Room for the window's peak alone (the previous
    rule) scaled down after a calm cooldown and back up at the next peak at each of these
    levels."""
    rules = Rules(1, 8, 0.7, 5.0, ScalingSpec().cooldown_s, 4)
    for seed in range(3):
        demand = [int(d) for d in np.random.default_rng(seed).poisson(level, size=1800)]
        moves = _moves(demand, 1, rules=rules)
        assert set(moves) == {1}, (seed, moves)


def test_to_zero_only_after_a_whole_cooldown_without_a_request() -> None:
    zero = Rules(0, 3, 0.7, 5.0, 60.0, 4)
    quiet = Load(0, 0, 0.0, at=100.0, idle_s=59.0)  # nothing now, but a request 59 s ago
    assert decide(zero, 1, 1, seen(quiet, rules=zero), now=100.0, last_change_at=0.0) == 1
    idle = Load(0, 0, 0.0, at=100.0, idle_s=60.0)
    assert decide(zero, 1, 1, seen(idle, rules=zero), now=100.0, last_change_at=0.0) == 0
    assert decide(zero, 1, 1, seen(idle, rules=zero), now=100.0, last_change_at=50.0) == 1
    assert decide(RULES, 1, 1, seen(idle), now=100.0, last_change_at=0.0) == 1  # min 1 keeps one


def test_a_report_seen_again_is_not_added_twice_and_old_ones_leave_the_window() -> None:
    """The controller adds the gateways' merged report at every tick (0.5 s) while they report
    every second: the same report comes twice."""
    window = Window(10.0)
    window.add(load(3, at=1.0))
    window.add(load(3, at=1.0))
    window.add(load(9, at=0.5))  # older than the latest: ignored
    assert [r.at for r in window.reports] == [1.0]
    window.add(load(2, at=12.0))
    assert [r.at for r in window.reports] == [12.0]
    assert window.since == 1.0
    assert window.clears(2, now=12.0)
    assert not window.clears(1, now=12.0)
