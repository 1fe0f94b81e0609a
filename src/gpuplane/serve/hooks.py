"""What a model's router calls out to, as interfaces the router owns: the metrics layer's event
hooks (`RouterEvents`) and the slots shared with other gateways (`SharedSlots`), with what that
table needs of a router (`SharedRouter`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuplane.serve.errors import Rejection
from gpuplane.serve.placement import Choice
from gpuplane.serve.slots import Lease, SlotTable


@dataclass(slots=True)
class RouterEvents:
    """Callbacks the metrics layer hooks into; the defaults do nothing."""

    placed: Callable[[str, Choice], None] = lambda model, choice: None
    rejected: Callable[[str, Rejection], None] = lambda model, reason: None
    reaped: Callable[[str, Lease], None] = lambda model, lease: None
    # (model, instance, healthy, why)
    health_changed: Callable[[str, str, bool, str], None] = lambda model, iid, ok, why: None


class SharedRouter(Protocol):
    """What the shared slot table needs of a model's router."""

    name: str
    slots: SlotTable

    def set_others(self, instance_id: str, n: int) -> None: ...


class SharedSlots(Protocol):
    """Slots shared with other gateways (`gateway.ha.mode: shared`; `serve/ha/shared.py`: in
    Redis). The router's own `SlotTable` is then this gateway's view of them: a placement it
    grants is committed here before the request proceeds."""

    def attach(self, router: SharedRouter) -> None:
        """Count the router's instances; the router calls it once, when made."""

    async def commit(self, model: str, lease: Lease) -> bool:
        """Is the slot the view granted free here too? False: the router's view was stale
        (the table has told it, through `set_others`, that the instance is full)."""

    def release(self, model: str, lease: Lease) -> None:
        """Free a lease `commit` granted; idempotent, never fails, never waits."""
