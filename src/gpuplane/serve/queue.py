"""A bounded wait queue, fair across tenants: strict priority, then weighted fair share, FIFO
within a tenant.

Pure. Weighted fairness is stride scheduling: each tenant carries a virtual `pass`; serving one of
its requests advances it by 1/weight, and the backlogged tenant with the lowest pass goes next. A
tenant that returns after being idle starts at the current virtual time, so idling earns no
credit. `pop(prefer=...)` may pick a tenant up to `slack` turns ahead of its fair turn when the
caller prefers its request (gpuplane uses this to hand a freed slot to a waiter whose prompt
prefix that instance holds); the slack bounds how far fairness can bend. Within the tenant it
picks, a preferred request among the first `LOOKAHEAD` may go before those ahead of it, each of
which may be passed over at most `max_passes` times; that bounds how far FIFO can bend.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# How far into a tenant's FIFO `pop` looks for a preferred item.
LOOKAHEAD = 32


@dataclass(slots=True, eq=False)
class Ticket(Generic[T]):
    """A queued item; hand it back to `remove` when its waiter gives up. Compared by
    identity."""

    item: T
    tenant: str
    priority: int
    seq: int
    removed: bool = False
    passed: int = 0  # times a later item of its tenant went first


@dataclass(slots=True)
class _Tenant(Generic[T]):
    weight: float
    pass_: float = 0.0
    waiting: dict[int, deque[Ticket[T]]] = field(default_factory=dict)  # by priority
    count: int = 0


class FairQueue(Generic[T]):
    def __init__(self, max_size: int, slack: float = 0.0, max_passes: int = 0) -> None:
        self.max_size = max_size
        self.slack = slack
        self.max_passes = max_passes
        self._tenants: dict[str, _Tenant[T]] = {}
        self._vtime = 0.0
        self._size = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self._size

    def is_full(self) -> bool:
        return self._size >= self.max_size

    def depth_by_tenant(self) -> dict[str, int]:
        return {name: t.count for name, t in self._tenants.items() if t.count}

    def position(self, ticket: Ticket[T]) -> int:
        """How many live tickets of higher or equal priority arrived before this one."""
        return sum(
            1
            for t in self._tenants.values()
            for prio, dq in t.waiting.items()
            for other in dq
            if not other.removed
            and (prio > ticket.priority or (prio == ticket.priority and other.seq < ticket.seq))
        )

    def push(self, item: T, tenant: str, weight: float = 1.0, priority: int = 0) -> Ticket[T]:
        """Enqueue; the caller checks `is_full()` first (ask, then commit)."""
        if self.is_full():
            raise OverflowError("queue is full")
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant(weight)
        state.weight = weight
        if state.count == 0:
            state.pass_ = max(state.pass_, self._vtime)
        ticket = Ticket(item, tenant, priority, next(self._seq))
        state.waiting.setdefault(priority, deque()).append(ticket)
        state.count += 1
        self._size += 1
        return ticket

    def items(self) -> Iterator[T]:
        """Every item still waiting, in no particular order."""
        for state in self._tenants.values():
            for waiting in state.waiting.values():
                yield from (t.item for t in waiting if not t.removed)

    def remove(self, ticket: Ticket[T]) -> bool:
        """Withdraw a ticket (its waiter left). Idempotent; False if already gone."""
        if ticket.removed:
            return False
        ticket.removed = True
        self._tenants[ticket.tenant].count -= 1
        self._size -= 1
        return True

    def pop(
        self,
        prefer: Callable[[T], float] | None = None,
        eligible: Callable[[T], bool] | None = None,
    ) -> T | None:
        """The next item by priority and fair share; None when nothing (eligible) waits.

        `eligible` filters items: one that may not go now keeps its place while the items behind
        it in its tenant's FIFO go ahead (a request waiting for a busy instance much quicker
        for it does not hold back the requests after it). With `prefer`, among tenants within
        `slack` of the fairest turn, the one whose next item scores highest goes first (ties
        keep fair order); then, within that tenant, the item that scores highest among its
        first `LOOKAHEAD` eligible ones goes, if it scores higher than the first and every item
        before it has been passed over fewer than `max_passes` times (ties keep FIFO order).
        """
        heads = self._heads(eligible)
        if not heads:
            return None
        fairest = min(heads, key=lambda h: (h[0].pass_, h[1].seq))
        chosen = fairest
        if prefer is not None and self.slack > 0:
            limit = fairest[0].pass_ + self.slack
            best = prefer(fairest[1].item)
            for head in heads:
                if head[0].pass_ > limit or head is fairest:
                    continue
                score = prefer(head[1].item)
                if score > best:
                    chosen, best = head, score
        state, ticket = chosen
        waiting = state.waiting[ticket.priority]
        if prefer is not None and self.max_passes > 0:
            ticket = self._bend(waiting, ticket, prefer, eligible)
        if waiting[0] is ticket:
            waiting.popleft()
        else:
            waiting.remove(ticket)
        ticket.removed = True
        state.count -= 1
        self._size -= 1
        self._vtime = max(self._vtime, state.pass_)
        state.pass_ += 1.0 / state.weight
        return ticket.item

    def _bend(
        self,
        waiting: deque[Ticket[T]],
        head: Ticket[T],
        prefer: Callable[[T], float],
        eligible: Callable[[T], bool] | None,
    ) -> Ticket[T]:
        """Among the first `LOOKAHEAD` eligible tickets from `head` on, the first that scores
        highest, reached only past tickets that may still be passed over (each passed one
        counts it); else `head`."""
        live = itertools.islice(
            (
                t
                for t in itertools.dropwhile(lambda t: t is not head, waiting)
                if not t.removed and (eligible is None or eligible(t.item))
            ),
            LOOKAHEAD,
        )
        ahead: list[Ticket[T]] = []
        best, best_ahead, best_score = head, 0, prefer(head.item)
        for ticket in live:
            if ahead:
                if ahead[-1].passed >= self.max_passes:
                    break
                score = prefer(ticket.item)
                if score > best_score:
                    best, best_ahead, best_score = ticket, len(ahead), score
            ahead.append(ticket)
        for passed in ahead[:best_ahead]:
            passed.passed += 1
        return best

    def _heads(self, eligible: Callable[[T], bool] | None) -> list[tuple[_Tenant[T], Ticket[T]]]:
        """Each tenant's first live, eligible ticket at the highest priority that has one."""
        by_prio: dict[int, list[tuple[_Tenant[T], Ticket[T]]]] = {}
        for state in self._tenants.values():
            if not state.count:
                continue
            for prio, dq in state.waiting.items():
                while dq and dq[0].removed:
                    dq.popleft()
                head = next(
                    (t for t in dq if not t.removed and (eligible is None or eligible(t.item))),
                    None,
                )
                if head is not None:
                    by_prio.setdefault(prio, []).append((state, head))
        return by_prio[max(by_prio)] if by_prio else []
