"""A reflector (client-go's word): list a resource, then watch it from the list's
resourceVersion, keeping a local copy of every object current, in one background thread.

The watch asks for bookmarks (`allowWatchBookmarks`), so a quiet resource still moves its
resourceVersion on and a reconnect resumes where it left; it is reopened every sync interval
(`timeoutSeconds`), and after an error (with a backoff that doubles up to the interval) from the
same resourceVersion; only a 410 Gone (the server compacted past it) lists afresh.
Objects are kept as the JSON the server sent (plain dicts, not the client's models: a
1,000-node list parses in milliseconds) and handed to `convert` as they change, so readers
get an already-converted view; `on_change` hears the key of each object an event changed, or
None after a list (everything may have changed). `last_contact` is when the server last
answered: a watch that hears nothing, not even a bookmark, for longer than the sync interval
means it is unreachable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("gpuplane.control.kubernetes")

T = TypeVar("T")
Obj = dict[str, Any]
PAGE = 500  # items per list page, as kubectl asks


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class Reflector(Generic[T]):
    """The objects `list_fn` lists (e.g. `CoreV1Api.list_node`) that match `label_selector`,
    converted by `convert` (None: not kept) and readable at any time as `view`."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        convert: Callable[[Obj], T | None],
        *,
        what: str,
        interval_s: float,
        label_selector: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[tuple[str, str] | None], None] | None = None,
    ) -> None:
        self._list_fn = list_fn
        self._convert = convert
        self.what = what
        self.interval_s = interval_s
        self._selector = label_selector
        self._clock = clock
        self._on_change = on_change
        self.view: dict[tuple[str, str], T] = {}
        self.resource_version: str | None = None
        self.relists = 0  # full lists after the first (each after a 410 Gone)
        self.last_contact: float | None = None
        self.error: str | None = None
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{what}", daemon=True)

    def start(self) -> Reflector[T]:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; idempotent. Closing the open stream wakes the thread at once."""
        self._stop.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # it may be closing itself
                resp.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def quiet_for(self) -> float | None:
        """Seconds since the server last answered (None: it never has)."""
        return None if self.last_contact is None else self._clock() - self.last_contact

    def snapshot(self) -> list[T]:
        with self._lock:
            return list(self.view.values())

    # -- the loop ---------------------------------------------------------------------------

    def _kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"_preload_content": False}
        if self._selector:
            kw["label_selector"] = self._selector
        return kw

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                backoff = 0.2
            except Exception as exc:  # the server is down or refused: retry, say why
                if self._stop.is_set():
                    return
                gone = getattr(exc, "status", None) == 410
                self.error = None if gone else describe_error(exc)
                if gone:  # only then list again: any other failure resumes where it was
                    log.info(
                        "%s: resourceVersion %s expired (410 Gone); listing again",
                        self.what,
                        self.resource_version,
                    )
                    self.resource_version = None
                else:
                    log.warning("%s: %s; retrying in %.1fs", self.what, self.error, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.interval_s)

    def _list(self) -> None:
        items: dict[tuple[str, str], T] = {}
        token: str | None = None
        while True:
            kw = self._kwargs()
            kw["limit"] = PAGE
            if token:
                kw["_continue"] = token
            body = read_json(self._list_fn(**kw, _request_timeout=self.interval_s))
            for obj in body.get("items", []):
                converted = self._convert(obj)
                if converted is not None:
                    items[_key(obj)] = converted
            token = body.get("metadata", {}).get("continue")
            if not token:
                break
        if self.synced.is_set():
            self.relists += 1
        self.view = items
        self.resource_version = body["metadata"]["resourceVersion"]
        self._contact()
        if self._on_change is not None:  # before `synced`: a reader that waited on it hears it
            self._on_change(None)
        self.synced.set()

    def _watch(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        kw = self._kwargs()
        resp = self._list_fn(
            **kw,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=max(1, int(self.interval_s)),
            _request_timeout=(self.interval_s, self.interval_s + 5),
        )
        with self._lock:
            self._resp = resp
        try:
            self._contact()
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if line:
                    self._event(json.loads(line))
        finally:
            with self._lock:
                self._resp = None
            resp.release_conn()

    def _event(self, event: Obj) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        self._contact()
        if kind == "ERROR":
            from kubernetes.client import ApiException

            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        self.resource_version = obj.get("metadata", {}).get(
            "resourceVersion", self.resource_version
        )
        if kind == "BOOKMARK":
            return
        key = _key(obj)
        converted = None if kind == "DELETED" else self._convert(obj)
        with self._lock:
            if converted is None:
                self.view.pop(key, None)
            else:
                self.view[key] = converted
        if self._on_change is not None:
            self._on_change(key)

    def _contact(self) -> None:
        self.last_contact = self._clock()
        self.error = None


def read_json(resp: Any) -> Obj:
    """The JSON body of a response read with `_preload_content=False`; the connection goes
    back to the pool."""
    try:
        data: Obj = json.loads(resp.data)
        return data
    finally:
        resp.release_conn()


def describe_error(exc: Exception) -> str:
    """A client or transport error in words: the server's answer and message, or why it could
    not be reached."""
    status = getattr(exc, "status", None)
    if status:
        body = getattr(exc, "body", None) or ""
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body or getattr(exc, "reason", "")
        return f"the API server answered {status}: {message}"
    return f"the API server is unreachable ({type(exc).__name__}: {exc})"
