"""The usage report of `GET /usage` (and so of `gpuplane usage`; the route is `routes.py`):
GPU-hours, slice-hours and cost per team and GPU model from the allocations in the control
plane's store, used and idle apart where the audit sample store of `control.samples_dir`
measured them, reconciled to the cards' physical GPU-hours.

The arithmetic is the audit's (`audit.collect.store` turns holdings into one sample per card
per step, `audit.usage` sums them); this module only reads the window the caller asked for
against the service's clock, and refuses a window too long to build in memory. The store is read
through `Holdings`, which the composition root hands over, so the audit imports no control
store. pyarrow is imported when a report is asked for, not with the API.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuplane.audit.settings import AuditSettings
from gpuplane.control.spec import parse_duration
from gpuplane.errors import ResourceError

if TYPE_CHECKING:  # the audit's collect modules import pyarrow: only when a report is read
    from gpuplane.audit.collect.store import Card, Holding

# One row per card per step is built in memory: a year at one a minute fits, a century does not.
MAX_STEPS = 1_000_000


class Holdings(Protocol):
    """The control plane's cards and who held which between `since` and `until` (unix
    seconds): `audit.collect.store.read_holdings` over the service's store."""

    def __call__(self, since: float, until: float) -> tuple[list[Card], list[Holding]]: ...


@dataclass(frozen=True, slots=True)
class Span:
    """The window of a report, in unix seconds, and its step."""

    since: float
    until: float
    step_s: float


def span(since: str, until: str | None, step: str, now: float) -> Span:
    """The window `since`..`until` (each a duration before `now`, like 7d, or an ISO time, UTC
    unless it says otherwise; `until` None: now) counted every `step`. Nothing is known past
    `now`: a later `until` is `now`. Raises ResourceError saying what to give instead."""
    at = datetime.fromtimestamp(now, UTC)
    lo = _when(since, at, "since")
    hi = min(_when(until, at, "until"), at) if until else at
    if lo >= hi:
        raise ResourceError(
            f"since {since} is not before until {until or 'now'}: give an earlier since"
        )
    try:
        step_s = parse_duration(step)
    except ValueError as exc:
        raise ResourceError(f"step: {exc}") from None
    if (steps := (hi - lo).total_seconds() / step_s) > MAX_STEPS:
        raise ResourceError(
            f"since {since} with step {step} is {steps:,.0f} steps a card (at most "
            f"{MAX_STEPS:,}): give a shorter window or a longer step"
        )
    return Span(lo.timestamp(), hi.timestamp(), step_s)


def _when(value: str, now: datetime, name: str) -> datetime:
    try:
        return now - timedelta(seconds=parse_duration(value))
    except ValueError:
        pass
    except OverflowError:
        raise ResourceError(
            f"{name} {value} reaches before the year 1: give a shorter duration"
        ) from None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise ResourceError(
            f"{name} {value!r} is neither a duration (7d, 12h, 90m) nor an ISO time "
            "(2026-11-30T00:00)"
        ) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def report(
    holdings: Holdings,
    window: Span,
    audit: AuditSettings,
    samples_dir: str | None,
    teams: Collection[str] | None,
) -> dict[str, Any]:
    """The usage report over `window` for `teams` (None: every team). Physical, free and the
    reconciliation are the whole pool's: they are about cards, not about a team."""
    from gpuplane.audit.collect.store import allocation_samples, window_of
    from gpuplane.audit.sample_store import SampleStore
    from gpuplane.audit.usage import measured, usage

    cards, held = holdings(window.since, window.until)
    allocations = allocation_samples(cards, held, window.since, window.until, window.step_s)
    if samples_dir is not None:
        if not Path(samples_dir).is_dir():
            raise ResourceError(
                f"control.samples_dir {samples_dir} is not a directory: collect samples there "
                f"with `gpuplane audit collect --out {samples_dir}`, or unset it"
            )
        allocations = measured(allocations, SampleStore(Path(samples_dir)), window.step_s)
    u = usage(allocations, window_of(window.since, window.until, window.step_s), audit)
    data = u.to_json()
    if teams is not None:
        data["teams"] = [t for t in data["teams"] if t["team"] in teams]
    return data | {
        "since": _iso(window.since),
        "until": _iso(window.until),
        "step_s": window.step_s,
        "measured": samples_dir is not None,
    }


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")
