"""The prefetcher: I/O ahead of compute on its own pool, bounded by items and bytes.

`Budget` is the pure back-pressure core (ask with `can_admit`, commit with `admit`, `release`
when the consumer is done with the data). `Prefetcher` runs `load(item)` jobs on a thread pool
and never holds more than `max_items` loaded-but-unconsumed items or `max_bytes` of them; a
single item larger than `max_bytes` is admitted only when nothing else is held, so it cannot
deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gpuplane.batch.errors import BatchError


class Budget:
    """Pure accounting of items and bytes held; not thread-safe (the Prefetcher locks it)."""

    __slots__ = ("bytes", "items", "max_bytes", "max_items")

    def __init__(self, max_items: int, max_bytes: int) -> None:
        if max_items < 1:
            raise BatchError(f"prefetch must allow at least 1 item, got {max_items}")
        if max_bytes < 1:
            raise BatchError(f"prefetch must allow at least 1 byte, got {max_bytes}")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.items = 0
        self.bytes = 0

    def can_admit(self, size: int) -> bool:
        if self.items == 0:
            return True  # an oversized item alone still gets through
        return self.items + 1 <= self.max_items and self.bytes + size <= self.max_bytes

    def admit(self, size: int) -> None:
        self.items += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.items -= 1
        self.bytes -= size
        if self.items < 0 or self.bytes < 0:
            raise BatchError("prefetch budget released more than it admitted (a bug)")


class Prefetcher:
    """Runs loads ahead of the consumer on `workers` threads, within a `Budget`.

    `submit(size, load)` blocks while the budget is full (back-pressure on the producer) and
    returns a Future; the consumer calls `release(size)` once it no longer needs the data.
    """

    def __init__(self, workers: int, max_items: int, max_bytes: int) -> None:
        self.budget = Budget(max_items, max_bytes)
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="fetch")
        self.peak_items = 0
        self.peak_bytes = 0

    def try_submit(self, size: int, load: Callable[[], Any]) -> Future[Any] | None:
        """Admit and start `load` if the budget allows now; None otherwise (ask, then commit)."""
        with self._cond:
            if not self.budget.can_admit(size):
                return None
            self.budget.admit(size)
            self.peak_items = max(self.peak_items, self.budget.items)
            self.peak_bytes = max(self.peak_bytes, self.budget.bytes)
        return self._pool.submit(load)

    def submit(
        self,
        size: int,
        load: Callable[[], Any],
        timeout: float | None = None,
    ) -> Future[Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: self.budget.can_admit(size), timeout):
                raise TimeoutError("prefetch budget stayed full")
        fut = self.try_submit(size, load)
        if fut is None:  # lost a race with another producer; wait again
            return self.submit(size, load, timeout)
        return fut

    def release(self, size: int) -> None:
        with self._cond:
            self.budget.release(size)
            self._cond.notify_all()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
