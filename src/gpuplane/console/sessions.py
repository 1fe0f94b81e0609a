"""The web console's sessions: a random id in an HttpOnly, SameSite=Strict cookie, and kept here,
server side, the API token it was opened with and the session's CSRF token.

The token is checked again at every request (`ControlService.authenticate`), so revoking it ends
its sessions too. Only console routes read the cookie (`auth.Rule.console`): a cookie never
authorises the JSON API. Sessions live in memory: a restart logs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "gpuplane_console"
TTL_S = 8 * 3600.0
LOGIN_CODE_TTL_S = 600.0  # a one-time login link printed at start is void after this


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    csrf: str
    expires_at: float


class Sessions:
    """Open console sessions by id; times from `clock`."""

    def __init__(self, clock: Callable[[], float], ttl_s: float = TTL_S) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self._open: dict[str, Session] = {}
        self._codes: dict[str, tuple[str, float]] = {}  # one-time login code -> (token, expiry)
        self._lock = threading.Lock()

    def issue_code(self, token: str, ttl_s: float = LOGIN_CODE_TTL_S) -> str:
        """A one-time login code for `token` (as Jupyter prints a login URL at start): the
        server prints it in a URL only to its own terminal; `redeem` takes it once, within
        `ttl_s`. The code is random, not the token, so the URL never shows the token."""
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._codes[code] = (token, self.clock() + ttl_s)
        return code

    def redeem(self, code: str | None) -> str | None:
        """The token of a login code, once: the code is void from then on, used or not in
        time; None for an unknown, used or expired code."""
        now = self.clock()
        with self._lock:
            self._codes = {c: v for c, v in self._codes.items() if v[1] > now}
            token, _ = self._codes.pop(code or "", (None, 0.0))
        return token

    def open(self, token: str) -> tuple[str, Session]:
        """A new session for a valid `token`: its id (the cookie's value) and the session."""
        now = self.clock()
        session = Session(token, secrets.token_urlsafe(32), now + self.ttl_s)
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._open = {k: s for k, s in self._open.items() if s.expires_at > now}
            self._open[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The open session of a cookie's value; None for none, an unknown or an expired one."""
        with self._lock:
            session = self._open.get(sid or "")
        return session if session is not None and session.expires_at > self.clock() else None

    def close(self, sid: str | None) -> None:
        """End a session; ending it again, or an unknown one, changes nothing."""
        with self._lock:
            self._open.pop(sid or "", None)


def csrf_matches(session: Session | None, sent: str | None) -> bool:
    """Whether a form carried its session's CSRF token (compared in constant time)."""
    return session is not None and sent is not None and hmac.compare_digest(session.csrf, sent)
