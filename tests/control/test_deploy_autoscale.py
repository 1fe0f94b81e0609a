"""Autoscaling's pure core on a fake clock: one tick to react, one step at a time, scale-down
only when the load fits on one instance fewer, and no oscillation at constant load."""

from __future__ import annotations

import itertools

import pytest

from gpuplane.control.deployments.autoscale import Load, Rules, decide

RULES = Rules(
    min=1, max=5, target_slot_util=0.7, max_queue_wait_s=5.0, cooldown_s=60.0, slots_per_instance=4
)


def load(in_flight: int, queued: int = 0, wait: float = 0.0, at: float = 0.0) -> Load:
    return Load(in_flight, queued, wait, at)


def test_up_at_the_first_tick_past_the_target() -> None:
    assert decide(RULES, 2, 2, load(5), now=0.0, last_change_at=None) == 2  # 5 <= 0.7 x 8
    assert decide(RULES, 2, 2, load(6), now=0.0, last_change_at=None) == 3  # 6 > 5.6


def test_up_when_the_oldest_request_waited_too_long() -> None:
    assert decide(RULES, 3, 3, load(4, 1, wait=4.9), 0.0, None) == 3
    assert decide(RULES, 3, 3, load(4, 1, wait=5.0), 0.0, None) == 4


def test_from_zero_when_a_request_waits() -> None:
    zero = Rules(0, 3, 0.7, 5.0, 60.0, 4)
    assert decide(zero, 0, 0, load(0), 0.0, None) == 0
    assert decide(zero, 0, 0, load(0, 1), 0.0, None) == 1


def test_one_step_at_a_time_while_an_instance_starts() -> None:
    assert decide(RULES, 3, 2, load(8, 10, wait=9.0), 0.0, None) == 3
    assert decide(RULES, 3, 3, load(8, 10, wait=9.0), 0.0, None) == 4


def test_never_past_max_or_below_min() -> None:
    assert decide(RULES, 5, 5, load(20, 50, wait=30.0), 0.0, None) == 5
    assert decide(RULES, 1, 1, load(0, at=1000.0), 1000.0, None) == 1
    assert decide(RULES, 9, 9, load(0), 0.0, None) == 5  # the rules changed: clamped at once


def test_down_only_when_the_load_fits_on_one_fewer_after_the_cooldown() -> None:
    # 3 instances, 12 slots; one fewer keeps 8 slots, 5.6 of them within the target
    assert decide(RULES, 3, 3, load(6, at=100.0), now=100.0, last_change_at=0.0) == 3
    assert decide(RULES, 3, 3, load(5, at=100.0), now=100.0, last_change_at=0.0) == 2
    assert decide(RULES, 3, 3, load(5, at=59.0), now=59.0, last_change_at=0.0) == 3  # cooling
    assert decide(RULES, 3, 3, load(2, 1, at=100.0), 100.0, last_change_at=0.0) == 3  # waits


def test_a_silent_gateway_changes_nothing() -> None:
    assert decide(RULES, 3, 3, load(0, at=0.0), now=11.0, last_change_at=None) == 3
    assert decide(RULES, 3, 3, None, now=11.0, last_change_at=None) == 3


@pytest.mark.parametrize("in_flight", range(21))
def test_no_oscillation_at_constant_load(in_flight: int) -> None:
    """30 simulated minutes, one tick a second, from every starting size: the replicas move
    one way only, then stay."""
    for start in range(RULES.min, RULES.max + 1):
        wanted, changed, moves = start, None, []
        for now in itertools.count(0):
            if now > 1800:
                break
            queued = max(0, in_flight - wanted * RULES.slots_per_instance)
            held = in_flight - queued
            new = decide(
                RULES,
                wanted,
                wanted,
                load(held, queued, 10.0 if queued else 0.0, at=now),
                float(now),
                changed,
            )
            if new != wanted:
                moves.append(new - wanted)
                wanted, changed = new, float(now)
        assert len(set(moves)) <= 1, (start, moves)


def test_to_zero_only_after_a_whole_cooldown_without_a_request() -> None:
    zero = Rules(0, 3, 0.7, 5.0, 60.0, 4)
    quiet = Load(0, 0, 0.0, at=100.0, idle_s=59.0)  # nothing now, but a request 59 s ago
    assert decide(zero, 1, 1, quiet, now=100.0, last_change_at=0.0) == 1
    idle = Load(0, 0, 0.0, at=100.0, idle_s=60.0)
    assert decide(zero, 1, 1, idle, now=100.0, last_change_at=0.0) == 0
    assert decide(zero, 1, 1, idle, now=100.0, last_change_at=50.0) == 1  # cooling
    assert decide(RULES, 1, 1, idle, now=100.0, last_change_at=0.0) == 1  # min 1 keeps one
