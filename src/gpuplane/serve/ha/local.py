"""The local allowance of a shared-mode gateway while the slot table is not whole (`shared.py`).

**Without Redis** (unreachable: LOCAL; back, but not every live gateway has registered its
leases again: RESYNC) a gateway fails closed. It admits on an instance only while the leases it
holds there are fewer than `share - bound`:

- `share` = capacity // the live gateways when the table was last whole (`local_share`; 0 for
  a gateway that joined less than `sync_s + timeout_s` before, which some may not have counted);
- `bound` = the least load (running + waiting) the instance's engine has reported since this
  gateway left the shared table, counting only readings taken `sync_s + timeout_s` after it
  left (`settle_s`); before the first, nothing is admitted; an engine that reports no load
  keeps its instance closed until Redis is back.

Why that never runs an engine past its capacity C, when Redis is lost at t0: every lease held
at t0 was granted by Redis, so they number at most C; call Q_g(t) those of gateway g still
running at t, and e_g(t) = max(0, Q_g(t) - share_g) its excess. Q_g only falls, so e_g does
too. (1) A gateway that has admitted since t0 holds at most its current `share - bound`: it
admitted only below it and `bound` only falls; so it runs at most max(share_g - bound_g, Q_g).
(2) A reading E at t ≥ t0 + settle counts every request admitted before t0 that still runs
(assumption: an admitted request reaches its engine within `sync_s + timeout_s`), so E ≥ Σ Q_g(t)
≥ Σ e_g(t) ≥ Σ e_g(t') for every t' ≥ t. (3) The shares sum to at most C: each gateway that
takes one counted every gateway that takes one (the age rule), and floor(C / n) falls as n
grows. Now let A be the gateways running more than their pre-t0 leases. If A is empty the
engine runs at most Σ Q_g ≤ C. Otherwise each g in A has Q_g ≤ share_g - bound_g ≤ share_g (no
excess) and runs at most share_g - bound_g ≤ share_g - Σ e; every other runs Q_g ≤ share_g +
e_g; the total is at most Σ share - |A| Σ e + Σ e ≤ C.
"""

from __future__ import annotations

from collections.abc import Sequence


def local_share(capacity: int, gateways: Sequence[str], me: str) -> int:
    """This gateway's part of an instance's `capacity` while the table is not whole:
    `capacity // len(gateways)`, and 0 for a gateway not in the list (one that never reached
    Redis, or joined too recently to be counted by all). The remainder is left unused: a share
    that only falls as the list grows keeps the sum within `capacity` even when the gateways'
    lists differ by a gateway that has just joined or died."""
    return capacity // len(gateways) if me in gateways else 0
