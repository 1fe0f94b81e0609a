"""The one loop timer of a proxied request: it starts a watcher of the client's connection when
the request is `WATCH_AFTER_S` old, cancels the request at its deadline, and ends a stream whose
engine stays silent between two chunks for `gateway.idle_timeout_s`.

One timer per request for all three, instead of asyncio.timeout, an eager watcher task and
aiohttp's read timers: a request that ends sooner than `WATCH_AFTER_S` starts no task."""

from __future__ import annotations

import asyncio
import enum

from starlette.types import Receive

from gpuplane.serve.reply import Reply

# The client's connection is watched from this age of a request on: a request that ends sooner
# starts no watcher task, and a client that leaves earlier is noticed at this age.
WATCH_AFTER_S = 0.02


class Cancel(enum.Enum):
    """Why the timer (or the watcher) cancelled the request's task."""

    DEADLINE = "deadline"
    CLIENT_LEFT = "client left"
    ENGINE_SILENT = "engine silent"  # between two chunks of a stream: ends the stream


class RequestTimer:
    """The deadline, the engine's silence and the client watcher of one request's task."""

    __slots__ = (
        "_at",
        "_handle",
        "_receive",
        "_reply",
        "_task",
        "_watcher",
        "cancelled_by",
        "client_left",
        "deadline_s",
        "expires_at",
        "idle_s",
        "silent_since",
    )

    def __init__(self, deadline_s: float, idle_s: float) -> None:
        self.deadline_s = deadline_s
        self.idle_s = idle_s
        self.client_left = False
        self.cancelled_by: Cancel | None = None
        self.expires_at = 0.0
        # loop time since which a stream waits on the engine's next chunk; None while it does not
        self.silent_since: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0
        self._watcher: asyncio.Task[None] | None = None
        self._receive: Receive | None = None
        self._reply: Reply | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, task: asyncio.Task[None], receive: Receive, reply: Reply) -> None:
        """Time `task` from now; the watcher reads `receive`, and `reply` tells it whether the
        answer had ended when the client left."""
        self._task = task
        self._receive = receive
        self._reply = reply
        now = asyncio.get_running_loop().time()
        self.expires_at = now + self.deadline_s
        self._set(min(now + WATCH_AFTER_S, self.expires_at))

    def stop(self) -> None:
        """The request ended: no more timer, no more watcher."""
        assert self._handle is not None
        self._handle.cancel()
        if self._watcher is not None:
            self._watcher.cancel()

    def _set(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_at(when, self._on_timer)
        self._at = when

    def _on_timer(self) -> None:
        """Start watching the client (first time), cancel at the deadline, end a stream whose
        engine was silent too long; then set the timer for what is due next."""
        assert self._receive is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self.expires_at:
            self._cancel(Cancel.DEADLINE)
            return
        silent_since = self.silent_since
        if silent_since is not None and now >= silent_since + self.idle_s:
            self._cancel(Cancel.ENGINE_SILENT)
            silent_since = None
        if self._watcher is None:
            self._watcher = loop.create_task(self._watch_client(self._receive))
        due = self.expires_at if silent_since is None else silent_since + self.idle_s
        self._set(min(due, self.expires_at))

    def wait_on_engine(self) -> None:
        """The stream now waits on the engine's next chunk: its silence counts from here."""
        now = asyncio.get_running_loop().time()
        self.silent_since = now
        if self._at > now + self.idle_s:
            self._set(now + self.idle_s)

    def uncancel_silence(self) -> bool:
        """The engine-silence cancel was caught: clear it; True when it was the task's only
        cancel (else the caller re-raises: cancelled for another reason too)."""
        self.cancelled_by = None
        assert self._task is not None
        return self._task.uncancel() == 0

    def _cancel(self, why: Cancel) -> None:
        if self.cancelled_by is None:
            assert self._task is not None
            self.cancelled_by = why
            self._task.cancel()

    async def _watch_client(self, receive: Receive) -> None:
        """Cancel the request's task when the client disconnects."""
        assert self._reply is not None
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_left = not self._reply.finished
                if self.client_left:
                    self._cancel(Cancel.CLIENT_LEFT)
                return
