"""The fake API server's HTTP side: the Kubernetes REST paths the adapter and `kubectl` use,
with the real wire format (JSON bodies, `Status` errors, chunked watch and log streams).

Served: `/version`; discovery (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`, the groups
the emulated minor version serves, and KServe's serving.kserve.io/v1beta1 when the fake has it);
nodes, namespaces, pods, batch/v1 jobs and KServe's inferenceservices: list (label and
field selectors, `limit`/`continue`), get, create (409 on an existing name, 404 in a missing
namespace), delete (grace period, propagation), merge patch; watch (`resourceVersion`,
`allowWatchBookmarks`, `timeoutSeconds`, 410 Gone as an ERROR event for a compacted
resourceVersion, synthetic ADDED events for `resourceVersion=0` or none); Pod logs (`tailLines`,
`limitBytes`, `follow`), each Pod's own: a new Pod of a deleted one's name starts
empty. Unlike a real server, `continue` pages the current objects rather than
the snapshot of the first page.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.control.k8s_fake.state import (
    RESOURCES,
    ApiError,
    Event,
    Obj,
    field_matcher,
    label_matcher,
    now_iso,
)

KSERVE = "serving.kserve.io/v1beta1"  # KServe's CRD: served by a fake with `kserve=True`
# group/version -> the minor versions that serve it (None: still served)
GROUP_VERSIONS: dict[str, tuple[int, int | None]] = {
    "batch/v1": (21, None),
    "policy/v1": (21, None),
    "policy/v1beta1": (0, 24),  # removed in 1.25
    "apps/v1": (9, None),
    "autoscaling/v2": (23, None),
    "autoscaling/v2beta2": (0, 25),
    "flowcontrol.apiserver.k8s.io/v1": (29, None),
    "flowcontrol.apiserver.k8s.io/v1beta3": (26, 31),
    "resource.k8s.io/v1": (34, None),
}
_RESOURCE_LISTS: dict[str, list[tuple[str, str, bool, list[str]]]] = {
    "v1": [
        ("nodes", "Node", False, ["get", "list", "watch", "patch", "create", "delete"]),
        ("namespaces", "Namespace", False, ["get", "list", "watch", "create", "delete"]),
        ("pods", "Pod", True, ["get", "list", "watch", "create", "delete", "patch"]),
        ("pods/log", "Pod", True, ["get"]),
    ],
    "batch/v1": [("jobs", "Job", True, ["get", "list", "watch", "create", "delete", "patch"])],
    KSERVE: [
        (
            "inferenceservices",
            "InferenceService",
            True,
            ["get", "list", "watch", "create", "delete", "patch"],
        )
    ],
}

_ROUTES = [
    (re.compile(r"^/api/v1/(nodes|namespaces|pods)$"), "v1"),
    (re.compile(r"^/api/v1/(nodes|namespaces)/(?P<name>[^/]+)$"), "v1"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(pods)$"), "v1"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(pods)/(?P<name>[^/]+)(?P<log>/log)?$"), "v1"),
    (re.compile(r"^/apis/batch/v1/(jobs)$"), "batch/v1"),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(jobs)$"), "batch/v1"),
    (re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(jobs)/(?P<name>[^/]+)$"), "batch/v1"),
    (re.compile(r"^/apis/serving.kserve.io/v1beta1/(inferenceservices)$"), KSERVE),
    (
        re.compile(
            r"^/apis/serving.kserve.io/v1beta1/namespaces/(?P<ns>[^/]+)/(inferenceservices)$"
        ),
        KSERVE,
    ),
    (
        re.compile(
            r"^/apis/serving.kserve.io/v1beta1/namespaces/(?P<ns>[^/]+)/(inferenceservices)/"
            r"(?P<name>[^/]+)$"
        ),
        KSERVE,
    ),
]


def served_groups(minor: int) -> list[str]:
    return [
        gv for gv, (lo, hi) in GROUP_VERSIONS.items() if lo <= minor and (hi is None or minor <= hi)
    ]


def _merge(target: Obj, patch: Obj) -> None:
    """JSON merge patch (RFC 7386): null deletes a key, mappings merge, the rest replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = v


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as they are written, as Go's do
    server: FakeHttpServer
    _read_body: Obj | None = None  # this request's body, once read

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read their own output
        pass

    # -- plumbing ----------------------------------------------------------------------------

    def _send(self, code: int, body: Obj | bytes, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> Obj:
        """The request's JSON body, read once."""
        if self._read_body is None:
            self._read_body = self._parse_body()
        return self._read_body

    def _parse_body(self) -> Obj:
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return {}
        try:
            body = json.loads(self.rfile.read(n))
        except json.JSONDecodeError as exc:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from None
        return body if isinstance(body, dict) else {}

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        url = url._replace(path=url.path.rstrip("/") or "/")
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        fake.requests.append((method, url.path))
        self._read_body = None
        try:
            if fake.unreachable:
                self._body()  # read it, so the connection's next request starts clean
                raise ApiError(503, "ServiceUnavailable", "the fake API server is unreachable")
            if method == "GET" and self._discovery(url.path):
                return
            for pattern, group in _ROUTES:
                m = pattern.match(url.path)
                if m and (group != KSERVE or fake.kserve is not None):
                    self._resource(method, m, q)
                    return
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        except ApiError as err:
            self._send(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = lambda self: self._dispatch("GET")  # noqa: E731
    do_POST = lambda self: self._dispatch("POST")  # noqa: E731
    do_DELETE = lambda self: self._dispatch("DELETE")  # noqa: E731
    do_PATCH = lambda self: self._dispatch("PATCH")  # noqa: E731
    do_PUT = lambda self: self._dispatch("PUT")  # noqa: E731

    # -- discovery ---------------------------------------------------------------------------

    def _discovery(self, path: str) -> bool:
        minor = self.server.fake.minor
        groups = served_groups(minor) + ([KSERVE] if self.server.fake.kserve is not None else [])
        if path == "/version":
            self._send(
                200,
                {
                    "major": "1",
                    "minor": str(minor),
                    "gitVersion": f"v1.{minor}.3",
                    "gitCommit": "0" * 40,
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.22.0",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        elif path == "/api":
            self._send(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.server.fake.address}
                    ],
                },
            )
        elif path == "/apis":
            by_group: dict[str, list[str]] = {}
            for gv in groups:
                g, v = gv.split("/")
                by_group.setdefault(g, []).append(v)
            self._send(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                            "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                        }
                        for g, vs in by_group.items()
                    ],
                },
            )
        elif path == "/api/v1" or (path.startswith("/apis/") and path.count("/") == 3):
            gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
            if gv != "v1" and gv not in groups:
                return False
            self._send(
                200,
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": gv,
                    "resources": [
                        {"name": n, "singularName": "", "namespaced": ns, "kind": k, "verbs": verbs}
                        for n, k, ns, verbs in _RESOURCE_LISTS.get(gv, [])
                    ],
                },
            )
        else:
            return False
        return True

    # -- resources ---------------------------------------------------------------------------

    def _resource(self, method: str, m: re.Match[str], q: dict[str, str]) -> None:
        fake = self.server.fake
        groups = m.groups()
        resource = next(g for g in groups if g in RESOURCES)
        _, kind, namespaced = RESOURCES[resource]
        ns = m.groupdict().get("ns")
        name = m.groupdict().get("name")
        if resource == "namespaces" and name is None and ns is not None:
            name = ns
        key_ns = (ns or "") if namespaced else ""
        if name is None:
            if method == "GET" and q.get("watch") in ("true", "1"):
                self._watch(resource, ns, q)
            elif method == "GET":
                self._list(resource, ns, q)
            elif method == "POST":
                body = self._body()
                if resource == "pods":
                    fake.check_pod(body)
                created = fake.state.create(resource, ns or "", body)
                if resource in ("pods", "jobs") and fake.slow_creates:
                    fake.slow_creates -= 1  # created, but the answer comes too late
                    time.sleep(fake.slow_create_s)
                self._send(201, created)
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {resource}")
            return
        if m.groupdict().get("log"):
            self._log(key_ns, name, q)
        elif method == "GET":
            self._send(200, fake.state.get(resource, key_ns, name))
        elif method == "DELETE":
            body = self._body()
            grace = body.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
            policy = body.get("propagationPolicy", q.get("propagationPolicy"))
            self._send(200, fake.delete(resource, key_ns, name, grace, policy))
        elif method == "PATCH":
            patch = self._body()
            self._send(200, fake.state.update(resource, key_ns, name, lambda o: _merge(o, patch)))
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {kind}")

    def _list(self, resource: str, ns: str | None, q: dict[str, str]) -> None:
        api_version, kind, _ = RESOURCES[resource]
        items, rv = self.server.fake.state.select(
            resource, ns, q.get("labelSelector"), q.get("fieldSelector")
        )
        meta: Obj = {"resourceVersion": str(rv)}
        start = 0
        if q.get("continue"):
            try:
                token = json.loads(base64.b64decode(q["continue"]))
                start, rv = int(token["start"]), int(token["rv"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "invalid continue token") from None
            meta["resourceVersion"] = str(rv)
        limit = int(q.get("limit") or 0)
        if limit and start + limit < len(items):
            token_bytes = json.dumps({"start": start + limit, "rv": rv}).encode()
            meta["continue"] = base64.b64encode(token_bytes).decode()
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start : start + limit]
        else:
            items = items[start:]
        self._send(
            200,
            {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items},
        )

    def _watch(self, resource: str, ns: str | None, q: dict[str, str]) -> None:
        fake = self.server.fake
        api_version, kind, _namespaced = RESOURCES[resource]
        lm, fm = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 1800)
        rv_text = q.get("resourceVersion") or "0"
        self._start_stream("application/json")

        def send(type_: str, obj: Obj) -> None:
            self._chunk(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

        def matches(obj: Obj | None) -> bool:
            if obj is None:
                return False
            in_ns = ns is None or obj["metadata"].get("namespace") == ns
            return in_ns and lm(obj["metadata"].get("labels", {})) and fm(obj)

        try:
            if rv_text == "0":  # "any": the current state as synthetic ADDED events first
                items, rv = fake.state.select(
                    resource, ns, q.get("labelSelector"), q.get("fieldSelector")
                )
                for item in items:
                    send("ADDED", {"apiVersion": api_version, "kind": kind, **item})
            else:
                rv = int(rv_text)
            last_bookmark = time.monotonic()
            generation = fake.watch_generation
            while not fake.state.closed and generation == fake.watch_generation:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                got = fake.state.events_after(rv, min(left, fake.bookmark_interval_s))
                if got is None:
                    send(
                        "ERROR",
                        ApiError(
                            410,
                            "Expired",
                            f"too old resource version: {rv} ({fake.state.compacted_rv})",
                        ).status(),
                    )
                    break
                events, rv = got
                if events and fake.watch_lag_s:
                    time.sleep(fake.watch_lag_s)  # a slow or distant API server
                for event in events:
                    if event.resource == resource:
                        self._send_event(send, event, matches)
                if bookmarks and time.monotonic() - last_bookmark >= fake.bookmark_interval_s:
                    send(
                        "BOOKMARK",
                        {
                            "kind": kind,
                            "apiVersion": api_version,
                            "metadata": {"resourceVersion": str(rv)},
                        },
                    )
                    last_bookmark = time.monotonic()
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    @staticmethod
    def _send_event(send: Any, event: Event, matches: Any) -> None:
        now, before = matches(event.obj), matches(event.old)
        if event.type == "MODIFIED" and before and not now:
            send("DELETED", event.obj)  # it left the selection
        elif event.type == "MODIFIED" and now and not before:
            send("ADDED", event.obj)
        elif now:
            send(event.type, event.obj)

    def _log(self, ns: str, name: str, q: dict[str, str]) -> None:
        fake = self.server.fake
        pod = fake.state.get("pods", ns, name)
        if pod.get("status", {}).get("phase") == "Pending":
            raise ApiError(
                400,
                "BadRequest",
                f'container "main" in pod "{name}" is waiting to start: ContainerCreating',
            )
        uid = pod["metadata"]["uid"]
        data = fake.logs.get(uid, b"")
        if q.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(q["tailLines"]) :]) if int(q["tailLines"]) else b""
        if q.get("limitBytes"):
            data = data[: int(q["limitBytes"])]
        if q.get("follow") not in ("true", "1"):
            self._send(200, data, "text/plain")
            return
        self._start_stream("text/plain")
        sent = len(fake.logs.get(uid, b"")) - len(data)
        try:
            if data:
                self._chunk(data)
            sent += len(data)
            while not fake.state.closed:
                full = fake.logs.get(uid, b"")
                if len(full) > sent:
                    self._chunk(full[sent:])
                    sent = len(full)
                elif fake.pod_done(ns, name):
                    break
                else:
                    time.sleep(0.02)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True


class FakeHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, fake: Any) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.fake = fake
        self.thread = threading.Thread(target=self.serve_forever, name="fake-kube-api", daemon=True)


__all__ = ["FakeHttpServer", "now_iso", "served_groups"]
