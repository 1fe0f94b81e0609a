"""Ray's token authentication, as the `ray` adapter meets it at a cluster's dashboard.

Ray 2.52 added a static bearer token that a cluster started with `RAY_AUTH_MODE=token` asks of
every HTTP and gRPC caller; from 2.59 a new local cluster turns it on by default and saves its
token at `~/.ray/auth_token`. The adapter takes the token the way Ray's own clients do, first
found wins: the cluster's `token_file` setting, `$RAY_AUTH_TOKEN`, the file `$RAY_AUTH_TOKEN_PATH`
names, `~/.ray/auth_token`. Sending one to a cluster without authentication is harmless, so a
token is sent whenever one is found. Only a reference (a path) is ever stored; the token is read
when the adapter starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuplane.control.adapters.base import AdapterError
from gpuplane.secrets import read_secret

HOW = (
    "set the cluster's `token_file` to a file holding its token (`ray get-auth-token` prints it "
    "on the head) or RAY_AUTH_TOKEN in the control plane's environment"
)


@dataclass(frozen=True, slots=True)
class RayToken:
    value: str
    source: str  # where it was read, for the error that says it was refused


def find_token(token_file: str | None) -> RayToken | None:
    """The token to send, or None where none is configured; a configured file that cannot be
    read is an error naming it, never a silent fall-through to the next source."""
    if token_file:
        return _read(Path(token_file).expanduser(), "token_file")
    if value := os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return RayToken(value, "$RAY_AUTH_TOKEN")
    if path := os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return _read(Path(path).expanduser(), "$RAY_AUTH_TOKEN_PATH")
    default = Path.home() / ".ray" / "auth_token"
    return _read(default, "Ray's default file") if default.is_file() else None


def _read(path: Path, via: str) -> RayToken:
    value = read_secret(path, f"the Ray token file {path} ({via})", AdapterError)
    return RayToken(value, f"{via} ({path})")


def refusal(where: str, status: int, token: RayToken | None) -> AdapterError:
    """The error for a dashboard that answered 401 (no token) or 403 (a wrong one)."""
    if token is None or status == 401:
        return AdapterError(f"{where} requires a token (Ray's token authentication); {HOW}")
    return AdapterError(f"{where} refused the token from {token.source}; {HOW}")
