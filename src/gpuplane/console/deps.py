"""What the console's routes are handed by FastAPI's `Depends`, beside the control API's own
(`control.api.deps`: the service and the caller): the login sessions and the store's holdings,
which `mount.Console` leaves in the app's state."""

from __future__ import annotations

from typing import cast

from fastapi import Request

from gpuplane.audit.usage_report import Holdings
from gpuplane.console.sessions import Sessions


def sessions_of(request: Request) -> Sessions:
    """The console's open sessions."""
    return cast(Sessions, request.app.state.sessions)


def holdings_of(request: Request) -> Holdings:
    """The store's cards and holdings over a window, for the overview's history."""
    return cast(Holdings, request.app.state.console_holdings)
