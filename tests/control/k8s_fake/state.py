"""The fake API server's object store: objects by resource, one resourceVersion counter, the
watch history (compactable, so a too-old resourceVersion gets 410 Gone), label and field
selectors. Pure state under one lock; `server.py` speaks HTTP over it, `kubelet.py` moves Pods.
"""

from __future__ import annotations

import copy
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]

# resource -> (apiVersion, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "nodes": ("v1", "Node", False),
    "namespaces": ("v1", "Namespace", False),
    "pods": ("v1", "Pod", True),
    "jobs": ("batch/v1", "Job", True),
    # a custom resource, served only by a fake with KServe installed (`FakeKubeApi(kserve=True)`)
    "inferenceservices": ("serving.kserve.io/v1beta1", "InferenceService", True),
}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An API error, answered as a `Status` object with its HTTP code."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{resource} "{name}" not found',
        {"name": name, "kind": resource},
    )


# -- selectors ---------------------------------------------------------------------------------

_SET_REQ = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_top(text: str) -> list[str]:
    """Comma-separated requirements, commas inside `( )` kept."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def _requirement(req: str) -> tuple[str, str, frozenset[str]]:
    """One requirement as (key, operator, values); operators: = != in notin exists !exists."""
    if "!=" in req:
        k, v = (x.strip() for x in req.split("!=", 1))
        return k, "!=", frozenset([v])
    m = _SET_REQ.match(req)
    if m is not None:
        neg, key, op, values = m.groups()
        vals = frozenset(x.strip() for x in (values or "").split(",") if x.strip())
        return key, op or ("!exists" if neg else "exists"), vals
    if "=" in req:
        k, v = (x.strip() for x in req.replace("==", "=").split("=", 1))
        return k, "=", frozenset([v])
    raise ApiError(400, "BadRequest", f"unable to parse requirement: {req!r}")


def _holds(labels: dict[str, str], key: str, op: str, values: frozenset[str]) -> bool:
    if op == "exists":
        return key in labels
    if op == "!exists":
        return key not in labels
    inside = labels.get(key) in values
    return inside if op in ("=", "in") else not inside


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A label selector (`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`)."""
    reqs = [_requirement(r) for r in _split_top(selector or "")]
    return lambda labels: all(_holds(labels, *r) for r in reqs)


FIELDS: dict[str, Callable[[Obj], str]] = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", ""),
    "status.phase": lambda o: o.get("status", {}).get("phase", ""),
}


def field_matcher(selector: str | None) -> Callable[[Obj], bool]:
    """A field selector over the fields the real server indexes for Pods and Nodes."""
    reqs: list[tuple[Callable[[Obj], str], str, bool]] = []
    for req in _split_top(selector or ""):
        neg = "!=" in req
        key, value = (x.strip() for x in req.replace("==", "=").replace("!=", "=").split("=", 1))
        if key not in FIELDS:
            raise ApiError(400, "BadRequest", f'field label not supported: "{key}"')
        reqs.append((FIELDS[key], value, neg))
    return lambda obj: all((get(obj) == value) != neg for get, value, neg in reqs)


# -- the store ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Event:
    rv: int
    resource: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    old: Obj | None


@dataclass(slots=True)
class State:
    """Every object of the fake cluster; `cond` wakes watchers on each change."""

    history_limit: int = 100_000
    lock: threading.RLock = field(default_factory=threading.RLock)
    cond: threading.Condition = field(init=False)
    rv: int = 1
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    compacted_rv: int = 0  # watches from a resourceVersion older than this get 410
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)

    def _record(self, resource: str, type_: str, obj: Obj, old: Obj | None) -> Event:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        event = Event(self.rv, resource, type_, copy.deepcopy(obj), old)
        self.events.append(event)
        if len(self.events) > self.history_limit:
            dropped = self.events[: len(self.events) - self.history_limit]
            self.compacted_rv = dropped[-1].rv
            del self.events[: len(dropped)]
        self.cond.notify_all()
        for listener in self.listeners:
            listener(event)
        return event

    def compact(self) -> None:
        """Forget the watch history (etcd compaction): older resourceVersions get 410 Gone."""
        with self.lock:
            self.compacted_rv = self.rv
            self.events.clear()

    def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        api_version, kind, namespaced = RESOURCES[resource]
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
            meta["name"] = name
        if not name:
            raise ApiError(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        with self.lock:
            if (
                namespaced
                and namespace != "default"
                and ("namespaces", "", namespace) not in (self.objects)
            ):
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    {"name": namespace, "kind": "namespaces"},
                )
            key = (resource, namespace if namespaced else "", name)
            if key in self.objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{resource} "{name}" already exists',
                    {"name": name, "kind": resource},
                )
            obj["apiVersion"], obj["kind"] = api_version, kind
            if namespaced:
                meta["namespace"] = namespace
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            meta.setdefault("labels", {})
            meta.setdefault("annotations", {})
            if resource == "pods":
                obj.setdefault("status", {"phase": "Pending"})
            self.objects[key] = obj
            self._record(resource, "ADDED", obj, None)
            return copy.deepcopy(obj)

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def update(
        self, resource: str, namespace: str, name: str, change: Callable[[Obj], None]
    ) -> Obj:
        """Apply `change` to the stored object in place (a controller's or kubelet's write)."""
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            old = copy.deepcopy(obj)
            change(obj)
            self._record(resource, "MODIFIED", obj, old)
            return copy.deepcopy(obj)

    def remove(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is not None:
                self._record(resource, "DELETED", obj, None)
            return obj

    def select(
        self,
        resource: str,
        namespace: str | None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> tuple[list[Obj], int]:
        """Matching objects sorted by (namespace, name), and the resourceVersion they are at."""
        lm, fm = label_matcher(labels), field_matcher(fields)
        with self.lock:
            items = [
                copy.deepcopy(o)
                for (res, ns, _), o in sorted(self.objects.items())
                if res == resource
                and (namespace is None or ns == namespace)
                and lm(o["metadata"].get("labels", {}))
                and fm(o)
            ]
            return items, self.rv

    def events_after(self, rv: int, timeout: float) -> tuple[list[Event], int] | None:
        """Events newer than `rv` (waiting up to `timeout` for one); None if `rv` was compacted."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                if rv < self.compacted_rv:
                    return None
                newer = (
                    [e for e in self.events[-(self.rv - rv) :] if e.rv > rv]
                    if (self.rv > rv)
                    else []
                )
                left = deadline - time.monotonic()
                if newer or left <= 0 or self.closed:
                    return newer, self.rv
                self.cond.wait(left)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.cond.notify_all()

    def iter_objects(self, resource: str) -> Iterator[Obj]:
        with self.lock:
            yield from [o for (res, _, _), o in self.objects.items() if res == resource]
