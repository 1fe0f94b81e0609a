"""The console on the control API's app: `Console` is the API's `deps.Pages`, built and handed
to `control.api.app.create_app` by the composition root (`plane.control_app`), so the control
API imports no console."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gpuplane.audit.usage_report import Holdings
from gpuplane.console import fleet, login, pages
from gpuplane.console.render import error_page, is_console
from gpuplane.console.sessions import COOKIE, Sessions
from gpuplane.control.identity.auth import Principal
from gpuplane.control.service.service import ControlService


class Console:
    """The web console over `service`; `holdings` reads the store for the overview's history.
    Its sessions live in memory, in this object: a restart logs everyone out."""

    def __init__(self, service: ControlService, holdings: Holdings) -> None:
        self.service = service
        self.holdings = holdings
        self.sessions = Sessions(service.clock)

    def add_to(self, app: FastAPI) -> None:
        app.state.sessions = self.sessions  # for `login_url`, printed at start
        app.state.console_holdings = self.holdings
        for router in (login.router, pages.router, fleet.router):
            app.include_router(router)

    def owns(self, request: Request) -> bool:
        return is_console(request)

    def caller(self, request: Request) -> Principal | None:
        """A console request's caller: its session's token checked again (None: not logged
        in, or the token was revoked or expired since); the session is kept on the request
        for CSRF."""
        session = self.sessions.get(request.cookies.get(COOKIE))
        request.state.console_session = session
        return self.service.authenticate(session.token) if session else None

    def refusal(self, request: Request, status: int, message: str) -> Response:
        return error_page(request, status, message)


def login_url(app: FastAPI, base_url: str, token: str) -> str:
    """A one-time URL that logs a browser into `app`'s console as `token` (single use, void
    after `LOGIN_CODE_TTL_S`), for a server to print to its own terminal at start."""
    sessions: Sessions = app.state.sessions
    return f"{base_url}/ui/login?code={sessions.issue_code(token)}"
