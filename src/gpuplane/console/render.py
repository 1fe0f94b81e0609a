"""How the console draws: its Jinja2 templates with its headers (a Content-Security-Policy that
allows nothing but this server: no external request), its error pages, and its forms, read with
their origin and CSRF token checked."""

from __future__ import annotations

import time
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from gpuplane.console.sessions import csrf_matches
from gpuplane.control.identity.auth import AuthError, Principal

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
CSS = files("gpuplane.console").joinpath("templates/console.css").read_text()


def _when(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


_env = Environment(
    loader=PackageLoader("gpuplane.console", "templates"),
    autoescape=select_autoescape(default=True),
    undefined=StrictUndefined,
)
_env.filters["when"] = _when


def is_console(request: Request) -> bool:
    return request.url.path == "/ui" or request.url.path.startswith("/ui/")


def error_page(request: Request, status: int, message: str) -> Response:
    """A console answer to a refused or failed call: to the login page when not logged in."""
    if status == 401:
        return RedirectResponse("/ui/login", status_code=303)
    who = getattr(request.state, "principal", None)  # `api.allow`'s, when it got that far
    return render(request, "error.html", who, status=status, status_code=status, message=message)


def render(
    request: Request, name: str, who: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    """The page `name` (a template) for `who`, with the console's headers."""
    session = getattr(request.state, "console_session", None)
    html = _env.get_template(name).render(
        who=who, csrf=session.csrf if session else "", path=request.url.path, **context
    )
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}
    return HTMLResponse(html, status_code=status, headers=headers)


async def form(request: Request) -> dict[str, str]:
    """A console form's urlencoded fields (a few short ones: the edge already cut the body at
    `control.http.max_form_bytes`), refused when a browser says it was posted from another
    site (so no page elsewhere can log a visitor into its session)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise AuthError(
            f"this form was posted from {origin}, not from this console: open the console at "
            f"{request.url.scheme}://{request.url.netloc}/ui and use its forms",
            403,
        )
    return dict(parse_qsl((await request.body()).decode("utf-8", "replace"), max_num_fields=20))


def check_csrf(request: Request, fields: dict[str, str]) -> None:
    """Refuse (403) a form without its session's CSRF token."""
    if not csrf_matches(getattr(request.state, "console_session", None), fields.get("csrf")):
        raise AuthError(
            "this form's CSRF token is missing or stale: reload the page and try again", 403
        )
