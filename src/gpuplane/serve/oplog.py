"""The gateway's operator log (logger `gpuplane.gateway`): instance health changes, requests
refused for capacity (429/503) and client connections closed at the edge.

Each line is an event whose fields ride in `extra` (`event`, `model`, `instance`, `reason`, ...),
which `gpuplane.logs`'s JSON formatter writes as fields of their own. A health change is logged
every time. Refusals come in bursts, so each kind (model and reason; edge reason) is logged at
most once per `every_s`, and that line says how many like it were left out since the one before
it; the exact counts are in /metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gpuplane.serve.errors import Rejection

log = logging.getLogger("gpuplane.gateway")

LOG_EVERY_S = 10.0

# What an operator can do when requests are refused for each reason.
_REMEDY = {
    Rejection.QUEUE_FULL: "add instances or raise gateway.queue.max_size",
    Rejection.QUEUE_TIMEOUT: "add instances or raise gateway.queue.timeout_s",
    Rejection.NO_HEALTHY_INSTANCE: "check the engines (GET /admin/state)",
    Rejection.NOT_LEADER: "clients retry at the leader (GET /admin/state shows which leads)",
}


@dataclass(slots=True)
class _Window:
    logged_at: float
    left_out: int = 0


class RateLimit:
    """At most one event per key per `every_s`, counting the ones it leaves out (the clock is
    injected; keys must come from a bounded set)."""

    def __init__(self, every_s: float, clock: Callable[[], float]) -> None:
        self.every_s = every_s
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}

    def admit(self, key: Hashable) -> int | None:
        """None: leave this event out. Otherwise log it, saying that this many events of its
        key were left out since the last one logged."""
        now = self._clock()
        window = self._windows.get(key)
        if window is None:
            self._windows[key] = _Window(now)
            return 0
        if now - window.logged_at < self.every_s:
            window.left_out += 1
            return None
        left_out, window.logged_at, window.left_out = window.left_out, now, 0
        return left_out


class GatewayLog:
    """The operator events of one gateway."""

    def __init__(
        self, *, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._limit = RateLimit(every_s, clock)

    def health_changed(self, model: str, instance: str, healthy: bool, reason: str) -> None:
        """An instance was marked unhealthy (with why) or healthy again (a `RouterEvents` hook)."""
        fields = {"model": model, "instance": instance, "reason": reason}
        if healthy:
            log.info(
                "instance %s of model '%s' is healthy again (%s) and gets new requests",
                instance,
                model,
                reason,
                extra={"event": "instance_recovered", **fields},
            )
        else:
            log.warning(
                "instance %s of model '%s' is unhealthy: %s; it gets no new requests until a "
                "health probe succeeds",
                instance,
                model,
                reason,
                extra={"event": "instance_unhealthy", **fields},
            )

    def rejected(self, model: str, reason: Rejection, status: int) -> None:
        """A request of a configured model got no slot and was answered `status`."""
        left_out = self._limit.admit(("rejected", model, reason))
        if left_out is None:
            return
        log.warning(
            "model '%s' refused a request with %d (%s): %s%s",
            model,
            status,
            reason.value,
            _REMEDY[reason],
            _more(left_out),
            extra={
                "event": "request_rejected",
                "model": model,
                "reason": reason.value,
                "status": status,
                "left_out": left_out,
            },
        )

    def connection_refused(self, reason: str, client: str, remedy: str) -> None:
        """The edge closed a client's connection before a request was read in full."""
        left_out = self._limit.admit(("connection_refused", reason))
        if left_out is None:
            return
        log.warning(
            "closed a connection from %s (%s): %s%s",
            client,
            reason,
            remedy,
            _more(left_out),
            extra={
                "event": "connection_refused",
                "reason": reason,
                "client": client,
                "left_out": left_out,
            },
        )


def _more(left_out: int) -> str:
    return f" ({left_out} more like it since the last such line)" if left_out else ""


__all__ = ["LOG_EVERY_S", "GatewayLog", "RateLimit"]
