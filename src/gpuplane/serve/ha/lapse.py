"""Has a shared-mode gateway missed its own leases' TTL? (`shared.py`)

Redis expires a lease `ttl_s` after it last renewed it; the gateway renews on its own monotonic
clock. A gateway paused for longer than the TTL (SIGSTOP, a stalled VM, a starved process)
wakes to leases Redis has expired and may have granted to other gateways, while the requests it
admitted on them may still run on the engines. Renewing them then counts them again only after
the others filled the instance; admitting on a grant older than the TTL runs an engine past its
capacity. So a gateway that missed its TTL leaves the shared table as one that lost Redis does:
it admits on the engines' load alone, and registers its leases again only once a reading of
the engines taken `settle_s` after it noticed counts every request admitted before.

Pure: the caller passes the monotonic time of each event.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class LeaseClock:
    """`renewed_at`: when the last renewal of every held lease was sent; `lapsed_at`: when the
    gateway found it had missed the TTL (None: it has not, or has rejoined since); `read_at`:
    when the engines' loads were last read (the read's start)."""

    ttl_s: float
    settle_s: float
    renewed_at: float | None = None
    lapsed_at: float | None = None
    read_at: float | None = None

    def renewing(self, now: float) -> None:
        """A renewal of every held lease is sent now."""
        self.renewed_at = now

    def missed(self, now: float, holding: bool) -> bool:
        """Has more than the TTL passed since the last renewal was sent, while leases were
        held? Then Redis may have expired every one of them: none is this gateway's to renew."""
        return holding and self.renewed_at is not None and now - self.renewed_at > self.ttl_s

    def in_time(self, sent_at: float, now: float) -> bool:
        """Is a grant of an acquire sent at `sent_at` still within its TTL now (an answer
        read after a pause may name a lease Redis has expired since)?"""
        return now - sent_at <= self.ttl_s

    def lapse(self, now: float) -> None:
        """The gateway found, at `now`, that it missed the TTL."""
        self.lapsed_at = now
        self.read_at = None

    def read(self, at: float) -> None:
        """The engines' loads were read, starting at `at`."""
        self.read_at = at

    def may_rejoin(self) -> bool:
        """May the gateway register its leases again? Not after a lapse until the engines were
        read `settle_s` after it (every request admitted before has reached its engine)."""
        if self.lapsed_at is None:
            return True
        return self.read_at is not None and self.read_at >= self.lapsed_at + self.settle_s

    def rejoined(self) -> None:
        """The gateway registers its leases again now: no renewal is due before that."""
        self.lapsed_at = None
        self.renewed_at = None
