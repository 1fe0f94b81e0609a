"""The trail holds user actions: a gateway's load heartbeat is not one (unless refused), old
events go after `control.events_retention_s`, `events --kind` filters, and the source of a call
is its peer unless a configured proxy says otherwise."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import select

from gpuplane.control.api.serving import server_config
from gpuplane.control.identity.auth import Role
from gpuplane.control.identity.config import HttpConfig
from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import Event
from gpuplane.control.store.trail import Retention
from gpuplane.plane import control_app
from tests.console.console_helpers import console_client
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import admin_token, api_client, config, job, make_service

LOAD = {"gateway": "gw-1", "models": []}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = make_service(config(str(tmp_path)))
    yield svc
    svc.close()


def api_events(service: ControlService) -> list[tuple[str, int | None]]:
    with service.store.session() as session:
        rows = session.scalars(select(Event).where(Event.kind == "api").order_by(Event.id))
        return [(e.message, e.status) for e in rows]


def test_a_gateways_load_heartbeat_is_not_a_trail_row_unless_refused(
    service: ControlService,
) -> None:
    _, member = service.tokens.create("m", Role.member, "research")
    with api_client(service) as http:
        for _ in range(5):
            assert http.post("/deployments/load", json=LOAD).status_code == 204
        http.post("/clusters/local/cordon")  # an admin's action: recorded
        refused = http.post(
            "/deployments/load", json=LOAD, headers={"authorization": f"Bearer {member}"}
        )
        assert refused.status_code == 403
    assert api_events(service) == [
        ("POST /clusters/local/cordon as admin", 200),
        ("POST /deployments/load as member", 403),
    ]


def test_events_past_retention_are_deleted_by_the_loop(tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    cfg = config(str(tmp_path)).model_copy(update={"events_retention_s": 7200.0})
    svc = ControlService(cfg, clock=clock, bind_on_submit=False)
    svc.start()
    try:
        old = svc.submit(job("old"))["id"]
        clock.now += 3600
        newer = svc.submit(job("newer"))["id"]
        clock.now += 3601  # "old"'s events are past the 2 h kept, "newer"'s are not
        svc.tick()
        with svc.store.session() as session:
            kept = set(session.execute(select(Event.job_id, Event.kind)))
        assert (newer, "submitted") in kept
        assert (old, "submitted") not in kept
    finally:
        svc.close()


def test_retention_prunes_at_most_once_per_period(service: ControlService) -> None:
    def add(at: float) -> None:
        with service.store.session() as session, session.begin():
            session.add(Event(at=at, kind="api", message="m"))

    retention = Retention(keep_s=100, every_s=50)
    add(0.0)
    add(120.0)
    assert retention.prune(service.store, 150.0) == 1  # 0 is past 100 s; 120 is not
    add(95.0)
    assert retention.prune(service.store, 199.0) == 0  # 95 is past, but not due until 200
    assert retention.prune(service.store, 200.0) == 1


def test_events_kind_filters_the_api_and_the_cli(service: ControlService) -> None:
    service.submit(job("a"))
    with api_client(service) as http:
        http.post("/clusters/local/cordon")
        kinds = {e["kind"] for e in http.get("/events", params={"kind": "api"}).json()}
        assert kinds == {"api"}
        both = http.get("/events", params=[("kind", "api"), ("kind", "submitted")]).json()
        assert {e["kind"] for e in both} == {"api", "submitted"}
    with serving(service) as url:
        code, out = cli(url, "events", "--kind", "submitted", "-o", "json")
    assert code == 0, out
    assert '"kind": "submitted"' in out
    assert '"kind": "api"' not in out


def _serve(service: ControlService, http: HttpConfig) -> tuple[uvicorn.Server, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    control = service.config.model_copy(update={"port": port, "http": http})
    server = uvicorn.Server(server_config(control_app(service, background=False), control))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    return server, thread


@pytest.mark.parametrize(("proxies", "source"), [([], "127.0.0.1"), (["127.0.0.1"], "203.0.113.9")])
def test_the_trail_believes_x_forwarded_for_from_configured_proxies_only(
    service: ControlService, proxies: list[str], source: str
) -> None:
    server, thread = _serve(service, HttpConfig(trusted_proxies=proxies))
    try:
        port = server.config.port
        r = httpx.post(
            f"http://127.0.0.1:{port}/clusters/local/cordon",
            headers={
                "authorization": f"Bearer {admin_token(service)}",
                "x-forwarded-for": "203.0.113.9",
            },
        )
        assert r.status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    with service.store.session() as session:
        sources = list(session.scalars(select(Event.source).where(Event.kind == "api")))
    assert sources == [source]


def test_a_console_login_is_recorded_as_its_caller_and_a_failed_one_is_counted(
    service: ControlService,
) -> None:
    _, member = service.tokens.create("m", Role.member, "research")
    with api_client(service) as http:
        browser, _ = console_client(http, member)
        browser.close()
        bad = http.post("/ui/login", data={"token": "gpl_wrong"})
        assert bad.status_code == 401
        metrics = http.get("/metrics").text
    assert api_events(service) == [("POST /ui/login as member", 303)]
    assert 'gpuplane_control_unidentified_calls_total{status="401"} 1.0' in metrics
