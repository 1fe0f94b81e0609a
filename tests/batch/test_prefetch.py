"""Prefetch: the budget's ask/commit rules and back-pressure under load."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from gpuplane.batch.errors import BatchError
from gpuplane.batch.prefetch import Budget, Prefetcher


def test_budget_bounds_items_and_bytes_but_admits_one_oversized_item() -> None:
    b = Budget(max_items=2, max_bytes=100)
    assert b.can_admit(60)
    b.admit(60)
    assert not b.can_admit(50)  # bytes
    assert b.can_admit(40)
    b.admit(40)
    assert not b.can_admit(0)  # items
    b.release(60)
    b.release(40)
    assert b.can_admit(1000)  # alone, even if larger than the byte bound
    b.admit(1000)
    assert not b.can_admit(1)
    b.release(1000)
    with pytest.raises(BatchError, match="bug"):
        b.release(1)
    with pytest.raises(BatchError):
        Budget(0, 10)


def test_prefetcher_never_holds_more_than_its_bounds() -> None:
    pf = Prefetcher(workers=4, max_items=3, max_bytes=250)
    held = 0
    peak = 0
    lock = threading.Lock()

    def load(size: int) -> int:
        nonlocal held, peak
        with lock:
            held += size
            peak = max(peak, held)
        time.sleep(0.01)
        return size

    sizes = [100, 80, 120, 60, 90, 100, 30, 40] * 3
    done: list[int] = []
    consumer_q: list[int] = []

    def produce() -> None:
        for s in sizes:
            fut = pf.submit(s, functools.partial(load, s), timeout=10)
            consumer_q.append(fut.result())

    t = threading.Thread(target=produce)
    t.start()
    while len(done) < len(sizes):
        if len(done) < len(consumer_q):
            s = consumer_q[len(done)]
            time.sleep(0.005)  # a slow consumer: the producer must wait for it
            with lock:
                held -= s
            pf.release(s)
            done.append(s)
        else:
            time.sleep(0.001)
    t.join()
    pf.close()
    assert done == sizes
    assert pf.peak_items <= 3
    assert pf.peak_bytes <= 250
    assert peak <= 250
    assert pf.budget.items == 0
    assert pf.budget.bytes == 0


def test_try_submit_refuses_when_full() -> None:
    pf = Prefetcher(workers=1, max_items=1, max_bytes=10)
    first = pf.try_submit(5, lambda: 1)
    assert first is not None
    assert first.result() == 1
    assert pf.try_submit(5, lambda: 2) is None
    pf.release(5)
    second = pf.try_submit(5, lambda: 3)
    assert second is not None
    assert second.result() == 3
    pf.release(5)
    pf.close()
