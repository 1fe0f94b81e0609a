"""Shared serve fixtures: routers on an injected clock, the gateway in-process over simulated
engines (`asgi_gateway`), and the teardown check that a test leaves no lease, no waiter and no
task behind (`leftovers`, used by every async serve test module)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuplane.serve.router import ModelRouter
from tests.helpers.serve import (
    assert_released,
)


@pytest.fixture
async def leftovers(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[ModelRouter]]:
    """The routers made during the test (yielded); at its end none may hold a lease or a
    waiter, and no task the test started may still run."""
    made: list[ModelRouter] = []
    init = ModelRouter.__init__

    def tracked(self: ModelRouter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ModelRouter, "__init__", tracked)
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    started: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        if previous is not None:
            task = previous(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        if loop.is_running():  # started by the test's code, not by the test runner
            started.add(task)
        return task

    loop.set_task_factory(factory)
    try:
        yield made
    finally:
        loop.set_task_factory(previous)
    current = asyncio.current_task()
    await assert_released(made, [t for t in started if t is not current])
