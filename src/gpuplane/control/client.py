"""A small HTTP client for the control plane's API, used by the CLI and end-to-end tests.

Transport and HTTP errors become `ClientError` with a message that says what to do. The bearer
token is the one given (`--token`, or `GPUPLANE_TOKEN`), else, for a server on this machine, the
local admin token it wrote to its state dir (`local_token`), so a local CLI needs no set-up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from gpuplane.control.identity.config import LOOPBACK_HOSTS
from gpuplane.control.settings import ControlConfig
from gpuplane.errors import GpuplaneError

DEFAULT_SERVER = "http://127.0.0.1:8080"
SERVER_ENV = "GPUPLANE_SERVER"
TOKEN_ENV = "GPUPLANE_TOKEN"
ADMIN_TOKEN_FILE = "admin.token"  # in the state dir; the service writes it (`tokens.py`)


class ClientError(GpuplaneError):
    """The control plane could not be reached, or refused the request."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def server_url(explicit: str | None = None) -> str:
    return (explicit or os.environ.get(SERVER_ENV) or DEFAULT_SERVER).rstrip("/")


def local_token(server: str, state_dir: str = ControlConfig().state_dir) -> str | None:
    """The admin token a server on this machine wrote to its state dir (the default one, under
    the current directory), when `server` is on loopback and the file is readable."""
    if urlsplit(server).hostname not in LOOPBACK_HOSTS:
        return None
    try:
        return (Path(state_dir) / ADMIN_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def api_path(template: str, *segments: str) -> str:
    """`template`'s `{}` filled with `segments`, each percent-encoded once as one path segment:
    a reference the user typed (`../clusters/lab/cordon?x=`) names a job, never another route
    or a query. A segment that is empty, `.`, `..` or holds a `/` can name nothing in the API
    and is refused (servers and proxies decode `%2F` and resolve dot segments)."""
    for segment in segments:
        if segment in ("", ".", "..") or "/" in segment:
            raise ClientError(
                f"'{segment}' is not a valid name or id: a name or id is one path segment, "
                "not empty, '.' or '..', and holds no '/'"
            )
    return template.format(*(quote(s, safe="") for s in segments))


class ControlClient:
    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.server = server_url(server)
        token = token or os.environ.get(TOKEN_ENV) or local_token(self.server)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.server, timeout=timeout_s, transport=transport, headers=headers
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, json: Any = None, **kwargs: Any) -> httpx.Response:
        with self._reached():
            response = self._http.request(method, path, **_body(json), **kwargs)
        _raise_for(response)
        return response

    @contextmanager
    def _reached(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as exc:
            raise ClientError(
                f"cannot reach the control plane at {self.server} ({type(exc).__name__}); "
                f"start it with `gpuplane control serve` or point --server / {SERVER_ENV} at it"
            ) from None

    def stream(self, path: str, **kwargs: Any) -> Iterator[bytes]:
        """GET `path` and yield its body as it arrives (errors as in `request`)."""
        with self._reached(), self._http.stream("GET", path, **kwargs) as response:
            if response.status_code >= 400:
                response.read()
            _raise_for(response)
            yield from response.iter_bytes()

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    # -- the API ------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = self.json(
            "POST", "/jobs", json=spec, params={"dry_run": str(dry_run).lower()}
        )
        return out

    def jobs(self, team: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("team", team), ("state", state)) if v}
        out: list[dict[str, Any]] = self.json("GET", "/jobs", params=params)
        return out

    def job(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("GET", api_path("/jobs/{}", ref))
        return out

    def cancel(self, ref: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("POST", api_path("/jobs/{}/cancel", ref))
        return out

    def move(self, ref: str, body: dict[str, Any]) -> dict[str, Any]:
        """Re-place a job on another node, keeping its id (`POST /jobs/{ref}/move`)."""
        out: dict[str, Any] = self.json("POST", api_path("/jobs/{}/move", ref), **_body(body))
        return out

    def logs(self, ref: str, tail: int | None = None, since: int = 0) -> Iterator[bytes]:
        """The job's output as it streams in: from byte `since`, or its last `tail` lines."""
        params = {"tail": tail} if tail is not None else {"since": since} if since else {}
        return self.stream(api_path("/jobs/{}/logs", ref), params=params)

    def clusters(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.json("GET", "/clusters")
        return out

    def cluster(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("GET", api_path("/clusters/{}", name))
        return out

    def add_cluster(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.json("POST", "/clusters", json=body)
        return out

    def remove_cluster(self, name: str) -> None:
        self.request("DELETE", api_path("/clusters/{}", name))

    def cluster_action(self, name: str, action: str, **params: Any) -> dict[str, Any]:
        """`cordon`, `uncordon` or `drain` (params: `requeue`) cluster `name`."""
        out: dict[str, Any] = self.json(
            "POST", api_path("/clusters/{}/{}", name, action), params=params
        )
        return out

    def teams(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.json("GET", "/teams")
        return out

    def team(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("GET", api_path("/teams/{}", name))
        return out

    def set_team(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.json("PUT", api_path("/teams/{}", name), json=body)
        return out

    def set_quota(self, team: str, flavor: str, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.json(
            "PUT", api_path("/teams/{}/quotas/{}", team, flavor), json=body
        )
        return out

    def apply_deployment(self, spec: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = self.json(
            "POST", "/deployments", json=spec, params={"dry_run": str(dry_run).lower()}
        )
        return out

    def deployments(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.json("GET", "/deployments")
        return out

    def deployment(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("GET", api_path("/deployments/{}", name))
        return out

    def scale_deployment(self, name: str, replicas: int) -> dict[str, Any]:
        out: dict[str, Any] = self.json(
            "POST", api_path("/deployments/{}/scale", name), json={"replicas": replicas}
        )
        return out

    def rollout(
        self, name: str, action: str = "status", version: str | None = None
    ) -> dict[str, Any]:
        """A deployment's rollout: `status`, or `promote` (a canary, `version` with several)
        or `rollback` (every canary drains)."""
        if action == "status":
            out: dict[str, Any] = self.json("GET", api_path("/deployments/{}/rollout", name))
        elif action == "promote":
            out = self.json(
                "POST", api_path("/deployments/{}/promote", name), json={"version": version}
            )
        else:
            out = self.json("POST", api_path("/deployments/{}/rollback", name))
        return out

    def delete_deployment(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("DELETE", api_path("/deployments/{}", name))
        return out

    def events(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The trail (`GET /events`): team, since (a duration), kind (a list) and limit as
        given."""
        out: list[dict[str, Any]] = self.json("GET", "/events", params=params)
        return out

    def usage(self, params: dict[str, Any]) -> dict[str, Any]:
        """The usage report (`GET /usage`): since, until, step and team as given."""
        out: dict[str, Any] = self.json("GET", "/usage", params=params)
        return out

    def create_token(self, body: dict[str, Any]) -> dict[str, Any]:
        """A new API token; its secret is in `token`, this once."""
        out: dict[str, Any] = self.json("POST", "/tokens", json=body)
        return out

    def tokens(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.json("GET", "/tokens")
        return out

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json("DELETE", api_path("/tokens/{}", token_id))
        return out

    def set_secret(self, team: str, name: str, value: str) -> dict[str, Any]:
        out: dict[str, Any] = self.json(
            "PUT", api_path("/teams/{}/secrets/{}", team, name), json={"value": value}
        )
        return out

    def secrets(self, team: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.json("GET", api_path("/teams/{}/secrets", team))
        return out

    def delete_secret(self, team: str, name: str) -> None:
        self.request("DELETE", api_path("/teams/{}/secrets/{}", team, name))


def _body(data: Any) -> dict[str, Any]:
    """A JSON request body. Encoded here rather than by httpx, which refuses inf and NaN: the
    API answers those with a 422 that names the field and its range."""
    if data is None:
        return {}
    return {
        "content": json.dumps(data),
        "headers": {"content-type": "application/json"},
    }


def _raise_for(response: httpx.Response) -> None:
    """A ClientError with the API's message for an HTTP error; FastAPI's validation errors as
    `field: what is wrong` each."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        body, detail = response.text, response.text
    if isinstance(detail, list):
        detail = "; ".join(f"{field}: {msg}" for field, msg in field_errors(body))
    raise ClientError(str(detail), response.status_code, body)


def field_errors(body: Any) -> list[tuple[str, str]]:
    """FastAPI's validation errors in an error body as (field, message), the field as the
    request names it: `resources.gpu_mem_mib` for `body.resources.gpu_mem_mib`, `state` for
    `query.state`. Empty for any other body."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, list):
        return []
    out = []
    for d in detail:
        loc = [str(p) for p in d.get("loc", [])]
        if loc[:1] and loc[0] in ("body", "query", "path") and len(loc) > 1:
            loc = loc[1:]
        out.append((".".join(loc), str(d.get("msg"))))
    return out
