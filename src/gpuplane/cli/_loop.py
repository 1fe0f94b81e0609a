"""The event loop that the long-running commands (gateway, up, engine sim) run on."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on uvloop when installed (uvicorn[standard] brings it): every
    request costs less event-loop CPU there than on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
