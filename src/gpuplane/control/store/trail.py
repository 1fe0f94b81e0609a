"""The store's trail of calls, and how long it keeps them.

Job steps and cluster changes go into the same `events` table from `records.py`; this module
adds what the API's `edge.Trail` records (kind `api`) and the retention that bounds the table:
events older than `control.events_retention_s` are deleted by the service's loop, at most once
per `PRUNE_EVERY_S`.
"""

from __future__ import annotations

from sqlalchemy import delete

from gpuplane.control.identity.auth import Principal
from gpuplane.control.store.models import Event
from gpuplane.control.store.store import Store

# Machine heartbeats, not user actions: a gateway reports its load every second (some 86,000
# rows a day each). Recorded only when refused, which is worth an operator's eye.
HEARTBEATS = frozenset({("POST", "/deployments/load")})
PRUNE_EVERY_S = 600.0


def recorded(method: str, path: str, status: int) -> bool:
    """Whether an identified caller's call goes into the trail: every one but a heartbeat
    that was answered well."""
    return (method, path) not in HEARTBEATS or status >= 400


def record_call(
    store: Store, at: float, call: str, who: Principal, source: str, status: int
) -> None:
    """Append an API call that changes something to the trail (`kind` api)."""
    with store.session() as session, session.begin():
        session.add(
            Event(
                at=at,
                kind="api",
                message=call[:2000],
                team_name=who.team,
                actor=who.subject,
                source=source[:255],
                status=status,
            )
        )


class Retention:
    """Deletes the trail's events older than `keep_s`; `prune` is called on every loop and does
    the work at most once per `every_s` (the delete walks the index on `at`)."""

    def __init__(self, keep_s: float, every_s: float = PRUNE_EVERY_S) -> None:
        self.keep_s = keep_s
        self.every_s = every_s
        self._next_at: float | None = None

    def prune(self, store: Store, now: float) -> int:
        """Delete what has passed retention when due; returns how many events went."""
        if self._next_at is not None and now < self._next_at:
            return 0
        self._next_at = now + self.every_s
        with store.session() as session, session.begin():
            gone = session.execute(delete(Event).where(Event.at < now - self.keep_s))
        return int(gone.rowcount)  # type: ignore[attr-defined]
