"""The prefetcher: a clip's fetch, ahead of compute on its own pool, bounded by items and bytes.

`Fetch` is what the I/O pool does per clip: its cache keys, its verified cache hits, and its
bytes only if a stage still to run reads them. `Budget` is the pure back-pressure core (ask with
`can_admit`, commit with `admit`, `release` when the consumer is done with the data).
`Prefetcher` runs `load(item)` jobs on a thread pool and never holds more than `max_items`
loaded-but-unconsumed items or `max_bytes` of them; a single item larger than `max_bytes` is
admitted only when nothing else is held, so it cannot deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuplane.batch.cache import StageCache
from gpuplane.batch.clips import ClipReader, ClipRef, verified
from gpuplane.batch.errors import BatchError
from gpuplane.batch.flow import ClipState, reads_clip
from gpuplane.batch.pipeline import Pipeline, cache_keys


@dataclass(frozen=True, slots=True)
class Fetch:
    """A clip's fetch on the I/O pool: keys, verified cache hits, and the clip's bytes only if a
    stage needs them (always with `verify`, whose digest of the bytes is the clip's version)."""

    pipeline: Pipeline
    cache: StageCache | None
    reader: ClipReader
    verify: bool

    def __call__(self, ref: ClipRef, fs: Any) -> ClipState:
        """Runs on an I/O thread, reading through `fs` (the driver's `ClipReader.fs_for`)."""
        raw = self.reader.read(ref, fs) if self.verify else None
        known = ref if raw is None else verified(ref, raw)
        clip = ClipState(known, cache_keys(self.pipeline, known.fingerprint))
        if self.cache is not None:
            for s in self.pipeline.looked_up():
                hit, value = self.cache.get(s.name, s.version, clip.keys[s.name])
                if hit:
                    clip.values[s.name] = value
                    clip.hits.append(s.name)
        if reads_clip(self.pipeline, clip.values):
            clip.data = self.pipeline.decode(raw if raw is not None else self.reader.read(ref, fs))
        return clip


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

    def usage(self) -> dict[str, int]:
        """Its bounds and the most it held at once (for the invocation's record)."""
        return {"max_items": self.budget.max_items, "max_bytes": self.budget.max_bytes,
                "peak_items": self.peak_items, "peak_bytes": self.peak_bytes}  # fmt: skip

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
