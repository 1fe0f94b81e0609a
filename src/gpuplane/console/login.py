"""The console's login and logout, and its style sheet: the routes open to anyone.

Login posts an API token once (or follows the one-time link a server prints at start); the
console keeps it server side (`sessions.py`) and hands the browser a random id in an HttpOnly,
SameSite=Strict cookie scoped to /ui.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from gpuplane.console.deps import sessions_of
from gpuplane.console.render import CSS, check_csrf, form, render
from gpuplane.console.sessions import COOKIE, LOGIN_CODE_TTL_S, Sessions
from gpuplane.control.api.deps import service_of
from gpuplane.control.identity.auth import Principal
from gpuplane.control.service.service import ControlService

router = APIRouter(include_in_schema=False)


@router.get("/ui/console.css")
def css() -> Response:
    return Response(CSS, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


@router.get("/ui/login")
def login_form(
    request: Request,
    code: str | None = None,
    sessions: Sessions = Depends(sessions_of),
    service: ControlService = Depends(service_of),
) -> Response:
    """The login page; with `code`, the one-time link printed at start logs in at once."""
    if code is None:
        return render(request, "login.html", None, error=None)
    token = sessions.redeem(code)
    if token is None or (who := service.authenticate(token)) is None:
        error = (
            "that login link was already used or has expired (it works once, for "
            f"{LOGIN_CODE_TTL_S / 60:.0f} minutes): restart the server for a new one, or "
            "paste a token below"
        )
        return render(request, "login.html", None, status=401, error=error)
    return _logged_in(request, sessions, token, who)


@router.post("/ui/login")
async def login(
    request: Request,
    sessions: Sessions = Depends(sessions_of),
    service: ControlService = Depends(service_of),
) -> Response:
    token = (await form(request)).get("token", "").strip()
    who = await run_in_threadpool(service.authenticate, token) if token else None
    if who is None:
        error = (
            "that token is not valid (malformed, unknown, revoked or expired): paste a "
            "token from `gpuplane token create`, or the local admin token in the state dir"
        )
        return render(request, "login.html", None, status=401, error=error)
    return _logged_in(request, sessions, token, who)


def _logged_in(request: Request, sessions: Sessions, token: str, who: Principal) -> Response:
    """A new session for a valid `token`: its cookie, and on to the overview."""
    request.state.principal = who  # the trail records who logged in (a failure: counted)
    sid, _ = sessions.open(token)
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        COOKIE,
        sid,
        max_age=int(sessions.ttl_s),
        path="/ui",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/ui/logout")
async def logout(request: Request, sessions: Sessions = Depends(sessions_of)) -> Response:
    sid = request.cookies.get(COOKIE)
    if sessions.get(sid) is not None:  # without a session there is nothing to end
        check_csrf(request, await form(request))
        sessions.close(sid)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response
