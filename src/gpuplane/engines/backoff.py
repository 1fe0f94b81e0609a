"""The pause before an engine's next start after it exits: what the gateway's supervisor and the
control plane's deployment controller both wait out before they start a crashed engine again."""

from __future__ import annotations

from dataclasses import dataclass

MAX_BACKOFF_S = 60.0  # the restart pause doubles up to this
STABLE_AFTER_S = 60.0  # an exit after this long up was no crash loop: the pause starts afresh
CRASH_LOOP_AFTER = 5  # quick crashes in a row that make an instance crash-looping


@dataclass(slots=True)
class Backoff:
    """The pause before each restart (pure): `initial_s`, doubled for each quick crash in a row
    (one within `stable_after_s` of its start), capped at `max_s`."""

    initial_s: float = 1.0
    max_s: float = MAX_BACKOFF_S
    stable_after_s: float = STABLE_AFTER_S
    crash_loop_after: int = CRASH_LOOP_AFTER
    quick_crashes: int = 0

    def after_exit(self, uptime_s: float) -> float:
        """Count an exit after `uptime_s` up and return the pause before the next start."""
        self.quick_crashes = self.quick_crashes + 1 if uptime_s < self.stable_after_s else 0
        doublings = min(max(self.quick_crashes - 1, 0), 64)
        return min(self.initial_s * 2.0**doublings, max(self.max_s, self.initial_s))

    @property
    def crash_looping(self) -> bool:
        return self.quick_crashes >= self.crash_loop_after
