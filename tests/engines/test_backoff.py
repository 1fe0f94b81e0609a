"""The pure restart pause (`engines/backoff.py`): doubling per quick crash up to the cap, a crash
loop after N quick crashes in a row, and a fresh start after a stable run."""

from __future__ import annotations

from gpuplane.engines.backoff import Backoff


def test_pause_doubles_per_quick_crash_up_to_the_cap() -> None:
    backoff = Backoff(initial_s=1.0, max_s=60.0, stable_after_s=30.0, crash_loop_after=5)
    pauses = [backoff.after_exit(uptime_s=2.0) for _ in range(9)]
    assert pauses == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_crash_looping_after_n_quick_crashes_and_reset_by_a_stable_run() -> None:
    backoff = Backoff(initial_s=1.0, max_s=60.0, stable_after_s=30.0, crash_loop_after=3)
    backoff.after_exit(uptime_s=1.0)
    backoff.after_exit(uptime_s=1.0)
    assert not backoff.crash_looping
    backoff.after_exit(uptime_s=1.0)
    assert backoff.crash_looping
    # up for longer than stable_after_s: the crash loop is over and the pause starts afresh
    assert backoff.after_exit(uptime_s=30.0) == 1.0
    assert not backoff.crash_looping
    assert backoff.after_exit(uptime_s=1.0) == 1.0


def test_a_pause_longer_than_the_cap_is_kept() -> None:
    backoff = Backoff(initial_s=90.0, max_s=60.0)
    assert [backoff.after_exit(0.0) for _ in range(3)] == [90.0, 90.0, 90.0]
