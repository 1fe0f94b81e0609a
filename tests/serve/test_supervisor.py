"""The engine supervisor: classified exits, restart backoff, crash loops and what the gateway
makes of them (the pause itself, `Backoff`, is tests/engines/test_backoff.py's). Engines are
`fake_engine.py` processes that kill themselves with SIGSEGV; the supervisor's clock and sleep
are injected, so no test waits out a restart pause."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuplane.config import parse_settings
from gpuplane.engines.base import EngineAdapter, LaunchSpec
from gpuplane.errors import EngineError
from gpuplane.serve.app import create_app
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.supervisor import (
    EngineState,
    EngineStatus,
    ManagedProcess,
    Supervisor,
)
from tests.helpers.common import free_port, gateway_settings


def engine_reporter(router: ModelRouter) -> Callable[[EngineStatus], None]:
    """The supervisor's `on_status` for the router of the model its instances serve (with no
    `name`, an instance's id is its URL)."""

    def report(status: EngineStatus) -> None:
        router.health.report_engine(
            status.url,
            up=status.state is EngineState.RUNNING,
            error=status.error,
            crash_looping=status.state is EngineState.CRASH_LOOPING,
        )

    return report


pytestmark = pytest.mark.anyio

FAKE_ENGINE = str(Path(__file__).with_name("fake_engine.py"))


@dataclass
class FakeTime:
    """The supervisor's clock and sleep: a pause is recorded and moves the clock at once; the
    pause numbered `park_at` (1-based) never ends, so the supervisor rests in that state."""

    park_at: int
    now: float = 1000.0
    pauses: list[float] = field(default_factory=list)
    parked: asyncio.Event = field(default_factory=asyncio.Event)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        if len(self.pauses) >= self.park_at:
            self.parked.set()
            await asyncio.Event().wait()  # until stop() cancels the watcher


def fake_launch(mode: str) -> tuple[str, str, LaunchSpec]:
    port = free_port()
    spec = LaunchSpec([sys.executable, FAKE_ENGINE, str(port), mode], {})
    return f"fake-{port}", f"http://127.0.0.1:{port}", spec


@pytest.fixture
async def supervisors() -> AsyncIterator[list[Supervisor]]:
    """Supervisors a test makes; each is stopped, and no engine process outlives the test."""
    made: list[Supervisor] = []
    yield made
    for supervisor in made:
        await supervisor.stop()
        assert all(
            p.process is None or p.process.returncode is not None for p in supervisor.processes
        )


def crash_looping_supervisor(
    log_dir: Path, time: FakeTime, statuses: list[EngineStatus]
) -> Supervisor:
    return Supervisor(
        EngineAdapter(),
        [fake_launch("serve-once")],
        log_dir=log_dir,
        restart_backoff_s=1.0,
        max_backoff_s=4.0,
        crash_loop_after=3,
        on_status=statuses.append,
        clock=time.clock,
        sleep=time.sleep,
    )


# -- real processes --------------------------------------------------------------------------


async def test_an_engine_that_segfaults_while_starting_fails_the_start_with_the_hint(
    tmp_path: Path, supervisors: list[Supervisor]
) -> None:
    supervisor = Supervisor(EngineAdapter(), [fake_launch("segfault")], log_dir=tmp_path)
    supervisors.append(supervisor)
    with pytest.raises(EngineError) as failed:
        await supervisor.start()
    message = str(failed.value)
    proc = supervisor.processes[0]
    assert f"{proc.name} was killed by SIGSEGV" in message
    assert "while starting" in message
    assert "rebuild it portably with `make engine-rebuild`" in message
    assert str(proc.log_path) in message
    assert proc.restarts == 0


async def test_restarts_back_off_and_quick_crashes_become_a_crash_loop(
    tmp_path: Path, supervisors: list[Supervisor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuplane.engine")
    time, statuses = FakeTime(park_at=5), list[EngineStatus]()
    supervisor = crash_looping_supervisor(tmp_path, time, statuses)
    supervisors.append(supervisor)
    await supervisor.start()
    await asyncio.wait_for(time.parked.wait(), 120)
    proc = supervisor.processes[0]

    assert time.pauses == [1, 2, 4, 4, 4]
    exits = [s for s in statuses if s.state is not EngineState.RUNNING]
    assert [s.state for s in exits] == [EngineState.RESTARTING] * 2 + [
        EngineState.CRASH_LOOPING
    ] * 3
    assert [s.state for s in statuses].count(EngineState.RUNNING) == 4  # each restart answered
    assert proc.restarts == 4
    last = exits[-1].error or ""
    assert last.startswith(f"{proc.name} is crash-looping: it exited 5 times in a row")
    assert "was killed by SIGSEGV" in last
    assert "`make engine-rebuild`" in last
    assert f"next start in 4 s (log: {proc.log_path})" in last

    exited = [r for r in caplog.records if getattr(r, "event", None) == "engine_exited"]
    assert [(r.exit, r.restarts, r.next_delay_s, r.state) for r in exited] == [  # type: ignore[attr-defined]
        ("SIGSEGV", 0, 1, "restarting"),
        ("SIGSEGV", 1, 2, "restarting"),
        ("SIGSEGV", 2, 4, "crash_looping"),
        ("SIGSEGV", 3, 4, "crash_looping"),
        ("SIGSEGV", 4, 4, "crash_looping"),
    ]
    assert all(r.instance == proc.name for r in exited)  # type: ignore[attr-defined]
    assert exited[-1].levelno == logging.ERROR
    restarted = [r for r in caplog.records if getattr(r, "event", None) == "engine_restarted"]
    assert [r.restarts for r in restarted] == [1, 2, 3, 4]  # type: ignore[attr-defined]


# -- what the gateway makes of it --------------------------------------------------------------


async def gateway_for(supervisor: Supervisor) -> tuple[Gateway, httpx.AsyncClient]:
    instances = [{"url": p.url, "max_concurrency": 1} for p in supervisor.processes]
    settings = parse_settings(
        gateway_settings([{"name": "smollm2", "engine": "llamacpp", "instances": instances}])
    )
    gateway = Gateway(settings)
    supervisor.on_status = engine_reporter(gateway.routers["smollm2"])
    transport = httpx.ASGITransport(app=create_app(settings, gateway=gateway))
    return gateway, httpx.AsyncClient(transport=transport, base_url="http://gateway")


async def state_and_answer_after_crashes(
    tmp_path: Path, supervisors: list[Supervisor], crashes: int
) -> tuple[ManagedProcess, dict[str, Any], httpx.Response]:
    """The gateway's /admin/state and its answer to a chat request once its one engine has
    crashed `crashes` times (the supervisor then waits to restart it)."""
    time = FakeTime(park_at=crashes)
    supervisor = crash_looping_supervisor(tmp_path, time, [])
    supervisors.append(supervisor)
    gateway, client = await gateway_for(supervisor)
    async with client:
        await supervisor.start()
        await asyncio.wait_for(time.parked.wait(), 120)
        state = (await client.get("/admin/state")).json()  # before any request fails there
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]},
        )
        await gateway.upstream.aclose()
    return supervisor.processes[0], state, answer


async def test_a_model_whose_every_instance_crash_loops_answers_503_with_the_diagnosis(
    tmp_path: Path, supervisors: list[Supervisor]
) -> None:
    proc, state, answer = await state_and_answer_after_crashes(tmp_path, supervisors, 3)
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert message.startswith(f"model 'smollm2' cannot be served: {proc.name} is crash-looping")
    assert "was killed by SIGSEGV" in message
    assert "rebuild it portably with `make engine-rebuild`" in message
    assert str(proc.log_path) in message
    [instance] = state["instances"]
    assert instance["state"] == "crash_looping"
    assert instance["last_error"] == message.removeprefix("model 'smollm2' cannot be served: ")


async def test_an_instance_waiting_to_restart_is_down_and_its_503_names_the_last_exit(
    tmp_path: Path, supervisors: list[Supervisor]
) -> None:
    proc, state, answer = await state_and_answer_after_crashes(tmp_path, supervisors, 1)
    assert answer.status_code == 503
    message = answer.json()["error"]["message"]
    assert message.startswith("all 1 instances of model 'smollm2' are unhealthy; retry later")
    assert f"{proc.name} was killed by SIGSEGV" in message
    assert "next start in 1 s" in message
    [instance] = state["instances"]
    assert instance["state"] == "unhealthy"
    assert "SIGSEGV" in instance["last_error"]
