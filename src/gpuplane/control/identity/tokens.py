"""API tokens: made, listed, revoked and checked; and the local admin token of the state dir.

A token reads `gpl_<id>_<secret>`: the id finds its row, and the row keeps HMAC-SHA256 of the
whole token under the service's key (`auth.key` in the state dir, 0600), never the token: a
copy of the store alone cannot forge or recover one. A keyed hash suits 256-bit random tokens,
which no dictionary guesses; a slow hash is for passwords. The token is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from gpuplane.control.errors import NotFoundError
from gpuplane.control.identity.auth import Principal, Role
from gpuplane.control.statedir import private_file
from gpuplane.control.store.models import ApiToken
from gpuplane.control.store.store import Store

PREFIX = "gpl_"
ADMIN_TOKEN_FILE = "admin.token"
KEY_FILE = "auth.key"
LOCAL_ADMIN = "local-admin"


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as `token list` shows it: everything but the secret."""

    id: str
    name: str
    team: str | None
    role: Role
    created_at: float
    expires_at: float | None
    revoked_at: float | None


class TokenBook:
    """The store's API tokens, hashed with `key`; times from `clock`."""

    def __init__(self, store: Store, key: bytes, clock: Callable[[], float]) -> None:
        self.store = store
        self.key = key
        self.clock = clock

    def create(
        self, name: str, role: Role, team: str | None, ttl_s: float | None = None
    ) -> tuple[TokenInfo, str]:
        """A new token and its secret (the only time it is seen)."""
        token_id = secrets.token_hex(6)
        token = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        now = self.clock()
        row = ApiToken(
            id=token_id,
            name=name,
            team_name=team,
            role=role.value,
            digest=self._digest(token),
            created_at=now,
            expires_at=None if ttl_s is None else now + ttl_s,
        )
        with self.store.session() as session, session.begin():
            session.add(row)
        return _info(row), token

    def list(self) -> list[TokenInfo]:
        with self.store.session() as session:
            rows = session.scalars(select(ApiToken).order_by(ApiToken.created_at))
            return [_info(r) for r in rows]

    def revoke(self, token_id: str) -> TokenInfo:
        """Revoke a token; revoking it again changes nothing."""
        with self.store.session() as session, session.begin():
            row = session.get(ApiToken, token_id)
            if row is None:
                raise NotFoundError(f"no token '{token_id}'; `gpuplane token list` shows them")
            if row.revoked_at is None:
                row.revoked_at = self.clock()
            return _info(row)

    def verify(self, token: str) -> Principal | None:
        """The caller a token stands for; None for a malformed, unknown, revoked or expired
        one (the caller is told no more than that)."""
        token_id = token.removeprefix(PREFIX).split("_", 1)[0]
        if not token.startswith(PREFIX) or not token_id:
            return None
        with self.store.session() as session:
            row = session.get(ApiToken, token_id)
        if row is None or not hmac.compare_digest(row.digest, self._digest(token)):
            return None
        if row.revoked_at is not None or (
            row.expires_at is not None and row.expires_at <= self.clock()
        ):
            return None
        return Principal(subject=row.id, role=Role(row.role), team=row.team_name)

    def local_admin(self, state_dir: Path) -> Path:
        """The state dir's admin token file (0600), made anew when absent or no longer valid
        (revoked, or from another store); returns its path."""
        path = state_dir / ADMIN_TOKEN_FILE
        if path.exists() and self.verify(path.read_text().strip()) is not None:
            return path
        path.unlink(missing_ok=True)
        private_file(path, lambda: self.create(LOCAL_ADMIN, Role.admin, None)[1].encode())
        return path

    def _digest(self, token: str) -> str:
        return hmac.new(self.key, token.encode(), hashlib.sha256).hexdigest()


def service_key(state_dir: Path) -> bytes:
    """The key tokens are hashed with: the state dir's `auth.key`, made at first start."""
    return private_file(state_dir / KEY_FILE, lambda: secrets.token_bytes(32))


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        name=row.name,
        team=row.team_name,
        role=Role(row.role),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )
