"""The event loop that the long-running commands (gateway, up, engine sim) run on."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# A request through the gateway makes a burst of short-lived objects, and asyncio and aiohttp leave
# a few reference cycles behind. At CPython's default threshold (700 more allocations than frees)
# the cyclic collector ran every ~10 requests, and its older generations walked every object made
# at import: 0.19 -> 0.175 ms of CPU per proxied request with the settings below (measured with
# benchmarks/gateway_fleet.py's zero-delay engines).
GEN0_THRESHOLD = 10_000


def settle_gc() -> None:
    """For a long-running server, once imports and setup are done: what exists now leaves the
    collector's generations for good (`gc.freeze`), and the youngest generation is collected
    when 10,000 objects more than freed were made instead of 700. Garbage cycles wait that much
    longer: a few thousand small objects."""
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on uvloop when installed (uvicorn[standard] brings it): every
    request costs less event-loop CPU there than on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
