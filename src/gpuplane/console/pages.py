"""The web console at `/ui`: server-rendered pages (Jinja2, no script) over the same queries and
the same policy table as the JSON API.

Login posts an API token once; the console keeps it server side (`sessions.py`) and hands the
browser a random id in an HttpOnly, SameSite=Strict cookie scoped to /ui. `api.allow` takes a
console route's caller from that cookie (`auth.Rule.console`) and every other route's from the
bearer token only, so a cookie never authorises the JSON API. Every console form that changes
something carries the session's CSRF token, checked here before anything is done. Pages answer
with a Content-Security-Policy that allows nothing but this server: no external request.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from gpuplane.audit import history
from gpuplane.console import fleet as console_fleet
from gpuplane.console.sessions import COOKIE, LOGIN_CODE_TTL_S, Sessions, csrf_matches
from gpuplane.control import queries
from gpuplane.control.auth import AuthError, Principal, Role
from gpuplane.control.models import ACTIVE_STATES, JOB_STATES, Allocation, Device, Job, Node
from gpuplane.control.service import ControlService
from gpuplane.control.views import NodeView, TeamView
from gpuplane.errors import ResourceError, unknown_name

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
ENDED = ("succeeded", "failed", "cancelled")
# the overview's history: how far back it looks (seconds), in this many steps
WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 24 * 3600.0, "7d": 7 * 24 * 3600.0}
STEPS = 48
_CSS = files("gpuplane.console").joinpath("templates/console.css").read_text()


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


async def _form(request: Request) -> dict[str, str]:
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


# -- what the pages show, shaped from the queries' views (pure) ----------------------------------


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One GPU model over the pool: cards, GPUs allocated (slices counted as their share), and
    cards wholly free."""

    model: str
    cards: int
    allocated_gpus: float
    free_cards: int


def by_model(nodes: list[NodeView]) -> list[ModelRow]:
    cards: dict[str, list[int]] = defaultdict(list)
    for node in nodes:
        for d in node.devices:
            cards[d.model].append(d.gpu_milli_free)
    return [
        ModelRow(m, len(free), sum(1000 - f for f in free) / 1000, sum(f == 1000 for f in free))
        for m, free in sorted(cards.items())
    ]


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """A team's quota on one flavor: nominal, used, borrowed from its cohort (used beyond
    nominal) and lent to it (its share of the cohort's borrowing, by its idle lendable quota)."""

    team: str
    cohort: str | None
    flavor: str
    nominal_gpus: float
    used_gpus: float
    borrowed_gpus: float
    lent_gpus: float
    borrowing_limit_gpus: float | None
    lending_limit_gpus: float | None


def quota_rows(teams: list[TeamView], shown: set[str] | None) -> list[QuotaRow]:
    """Rows of `teams` (every team: lending is a cohort's sum) for the `shown` ones (None: all)."""
    borrowed: dict[tuple[str | None, str], float] = defaultdict(float)
    idle: dict[tuple[str, str], float] = {}
    idle_sum: dict[tuple[str | None, str], float] = defaultdict(float)
    for t in teams:
        for q in t.quotas:
            borrowed[(t.cohort, q.flavor)] += max(0.0, q.used_gpus - q.gpus)
            spare = max(0.0, q.gpus - q.used_gpus)
            if q.lending_limit_gpus is not None:
                spare = min(spare, q.lending_limit_gpus)
            idle[(t.name, q.flavor)] = spare if t.cohort else 0.0
            idle_sum[(t.cohort, q.flavor)] += idle[(t.name, q.flavor)]
    rows = []
    for t in teams:
        if shown is not None and t.name not in shown:
            continue
        for q in t.quotas:
            key = (t.cohort, q.flavor)
            total = idle_sum[key]
            lent = min(borrowed[key], total) * idle[(t.name, q.flavor)] / total if total else 0.0
            rows.append(
                QuotaRow(
                    t.name,
                    t.cohort,
                    q.flavor,
                    q.gpus,
                    q.used_gpus,
                    max(0.0, q.used_gpus - q.gpus),
                    lent,
                    q.borrowing_limit_gpus,
                    q.lending_limit_gpus,
                )
            )
    return rows


@dataclass(frozen=True, slots=True)
class Slice:
    """A job's share of one card; `job_id` None: another team's job, not named."""

    job_id: str | None
    label: str
    gpu_milli: int
    mem_mib: int


@dataclass(slots=True)
class Card:
    index: int
    model: str
    mem_mib: int
    gpu_milli_free: int
    slices: list[Slice] = field(default_factory=list)


def card_map(
    nodes: list[NodeView], held: list[tuple[str, str, int, Slice, str]], shown: set[str] | None
) -> list[tuple[NodeView, list[Card]]]:
    """Each node's cards with their slices; `held`: (cluster, node, card, slice, team) of every
    active job; a slice of a team not `shown` (None: all) keeps its size but not its job."""
    out = []
    for node in nodes:
        cards = {d.index: Card(d.index, d.model, d.mem_mib, d.gpu_milli_free) for d in node.devices}
        for cluster, name, index, s, team in held:
            if (cluster, name) == (node.cluster, node.name) and index in cards:
                hidden = shown is not None and team not in shown
                cards[index].slices.append(
                    Slice(None, "held by another team", s.gpu_milli, s.mem_mib) if hidden else s
                )
        out.append((node, [cards[i] for i in sorted(cards)]))
    return out


def _held(service: ControlService) -> list[tuple[str, str, int, Slice, str]]:
    """Every card share held by an admitted or running job."""
    query = (
        select(Node.cluster_name, Node.name, Device.index, Allocation, Job.name, Job.team_name)
        .join(Device, Allocation.device_id == Device.id)
        .join(Node, Device.node_id == Node.id)
        .join(Job, Allocation.job_id == Job.id)
        .where(Job.state.in_(ACTIVE_STATES))
    )
    with service.store.session() as session:
        return [
            (c, n, i, Slice(a.job_id, f"{name} ({team})", a.gpu_milli, a.mem_mib), team)
            for c, n, i, a, name, team in session.execute(query)
        ]


# -- the routes ----------------------------------------------------------------------------------


def add_console(
    app: FastAPI,
    service: ControlService,
    sessions: Sessions,
    caller: Callable[..., Principal],
) -> None:
    """The console's routes on `app`; `caller` is the app's dependency for the logged-in caller
    (the policy table has already let it through)."""

    def check_csrf(request: Request, form: dict[str, str]) -> None:
        if not csrf_matches(getattr(request.state, "console_session", None), form.get("csrf")):
            raise AuthError(
                "this form's CSRF token is missing or stale: reload the page and try again", 403
            )

    @app.get("/ui/console.css", include_in_schema=False)
    def css() -> Response:
        return Response(_CSS, media_type="text/css", headers={"Cache-Control": "max-age=3600"})

    @app.get("/ui/login", include_in_schema=False)
    def login_form(request: Request, code: str | None = None) -> Response:
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
        return _logged_in(request, token, who)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        token = (await _form(request)).get("token", "").strip()
        who = await run_in_threadpool(service.authenticate, token) if token else None
        if who is None:
            error = (
                "that token is not valid (malformed, unknown, revoked or expired): paste a "
                "token from `gpuplane token create`, or the local admin token in the state dir"
            )
            return render(request, "login.html", None, status=401, error=error)
        return _logged_in(request, token, who)

    def _logged_in(request: Request, token: str, who: Principal) -> Response:
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

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        sid = request.cookies.get(COOKIE)
        if sessions.get(sid) is not None:  # without a session there is nothing to end
            check_csrf(request, await _form(request))
            sessions.close(sid)
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    @app.get("/ui", include_in_schema=False)
    def overview(
        request: Request, window: str = "24h", who: Principal = Depends(caller)
    ) -> Response:
        if window not in WINDOWS:
            raise ResourceError(unknown_name("history window", window, WINDOWS))
        clusters = queries.list_clusters(service)
        models = by_model(queries.list_nodes(service))
        past = history.read(
            service.store, service.config.samples_dir, service.clock(), WINDOWS[window], STEPS
        )
        return render(
            request,
            "overview.html",
            who,
            clusters=clusters,
            models=models,
            history=past,
            windows=list(WINDOWS),
            window=window,
        )

    @app.get("/ui/jobs", include_in_schema=False)
    def jobs(
        request: Request, team: str = "", state: str = "", who: Principal = Depends(caller)
    ) -> Response:
        listed = queries.list_jobs(service, team or None, state or None, 500, who.teams())
        teams = [t.name for t in queries.list_teams(service, who.teams())]
        return render(
            request,
            "jobs.html",
            who,
            jobs=listed,
            teams=teams,
            states=JOB_STATES,
            team=team,
            state=state,
        )

    @app.get("/ui/jobs/{ref}", include_in_schema=False)
    def job(request: Request, ref: str, who: Principal = Depends(caller)) -> Response:
        view = queries.get_job(service, ref, who.teams())
        can_cancel = view.state not in ENDED and who.role.covers(Role.member)
        return render(request, "job.html", who, job=view, can_cancel=can_cancel)

    @app.post("/ui/jobs/{ref}/cancel", include_in_schema=False)
    async def cancel(request: Request, ref: str, who: Principal = Depends(caller)) -> Response:
        check_csrf(request, await _form(request))
        job_id = await run_in_threadpool(service.cancel, ref, who.teams())
        return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)

    @app.get("/ui/quotas", include_in_schema=False)
    def quotas(request: Request, who: Principal = Depends(caller)) -> Response:
        shown = who.teams()
        teams = queries.list_teams(service)
        rows = quota_rows(teams, shown)
        mine = [t for t in teams if shown is None or t.name in shown]
        return render(request, "quotas.html", who, rows=rows, teams=mine)

    @app.get("/ui/gpus", include_in_schema=False)
    def gpus(request: Request, who: Principal = Depends(caller)) -> Response:
        nodes = card_map(queries.list_nodes(service), _held(service), who.teams())
        return render(request, "gpus.html", who, nodes=nodes)

    @app.get("/ui/events", include_in_schema=False)
    def events(request: Request, team: str = "", who: Principal = Depends(caller)) -> Response:
        listed = queries.list_events(service, team or None, None, 300, who.teams())
        return render(request, "events.html", who, events=list(reversed(listed)), team=team)

    console_fleet.add_pages(app, service, caller, render)


def login_url(app: FastAPI, base_url: str, token: str) -> str:
    """A one-time URL that logs a browser into `app`'s console as `token` (single use, void
    after `LOGIN_CODE_TTL_S`), for a server to print to its own terminal at start."""
    sessions: Sessions = app.state.sessions
    return f"{base_url}/ui/login?code={sessions.issue_code(token)}"


def session_caller(
    service: ControlService, sessions: Sessions, request: Request
) -> Principal | None:
    """A console request's caller: its session's token checked again (None: not logged in, or
    the token was revoked or expired since); the session is kept on the request for CSRF."""
    session = sessions.get(request.cookies.get(COOKIE))
    request.state.console_session = session
    return service.authenticate(session.token) if session else None
