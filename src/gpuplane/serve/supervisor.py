"""Start engine processes, wait until they answer, restart the ones that die, stop them all.

The shell around an `EngineAdapter`: the adapter says what to run and where it answers, this
module owns the processes. One asyncio task watches each process. An exit is classified
(`engines.diagnose`), logged, published to `on_status` (the gateway marks the instance down
with that diagnosis) and followed by a restart after a pause that doubles with each quick crash
(`Backoff`). After `crash_loop_after` quick crashes in a row the instance is crash-looping; it
is still retried every `max_backoff_s`, because a cause may clear (memory freed, a port let go)
and an engine rebuilt meanwhile (`make engine-rebuild`) is what the next start runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import httpx

from gpuplane.engines.backoff import CRASH_LOOP_AFTER, MAX_BACKOFF_S, STABLE_AFTER_S, Backoff
from gpuplane.engines.base import EngineAdapter, LaunchSpec
from gpuplane.engines.diagnose import ExitDiagnosis, classify_exit, log_tail
from gpuplane.errors import EngineError

log = logging.getLogger("gpuplane.engine")


class EngineState(StrEnum):
    RUNNING = "running"  # started and answering its health path
    RESTARTING = "restarting"  # exited; waiting to start again
    CRASH_LOOPING = "crash_looping"  # exited quickly `crash_loop_after` times in a row


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """What the supervisor says about one instance, after each exit and each start that answers."""

    name: str
    url: str
    state: EngineState
    restarts: int
    error: str | None  # the diagnosis of its last exit, with the hint and the log's path


@dataclass(slots=True)
class ManagedProcess:
    """One engine instance: its launch spec, its live process and how often it restarted."""

    name: str
    url: str
    spec: LaunchSpec
    log_path: Path
    backoff: Backoff
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0  # on the supervisor's clock
    error: str | None = None  # the diagnosis of its last exit
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def status(self, state: EngineState) -> EngineStatus:
        return EngineStatus(self.name, self.url, state, self.restarts, self.error)


class Supervisor:
    def __init__(
        self,
        adapter: EngineAdapter,
        instances: list[tuple[str, str, LaunchSpec]],
        *,
        log_dir: Path,
        start_timeout_s: float = 120.0,
        restart_backoff_s: float = 1.0,
        max_backoff_s: float = MAX_BACKOFF_S,
        stable_after_s: float = STABLE_AFTER_S,
        crash_loop_after: int = CRASH_LOOP_AFTER,
        on_status: Callable[[EngineStatus], None] = lambda status: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`clock` times each process's uptime and `sleep` waits out the restart pauses (tests
        inject both); `on_status` hears every exit and every restart that answers."""
        self.adapter = adapter
        self.start_timeout_s = start_timeout_s
        self.on_status = on_status
        self._clock = clock
        self._sleep = sleep
        log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = [
            ManagedProcess(
                name,
                url,
                spec,
                log_dir / f"{name}.log",
                Backoff(restart_backoff_s, max_backoff_s, stable_after_s, crash_loop_after),
            )
            for name, url, spec in instances
        ]
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start every instance and wait until all answer their health path; an instance that
        exits or stays silent fails the start with its diagnosis, and every process is stopped."""
        for proc in self.processes:
            await self._spawn(proc)
        waits = [asyncio.ensure_future(self._start_one(p)) for p in self.processes]
        try:
            await asyncio.gather(*waits)
        except BaseException:
            for wait in waits:
                wait.cancel()
            await self.stop()
            raise
        self._watchers = [asyncio.create_task(self._watch(p)) for p in self.processes]

    async def stop(self) -> None:
        """Terminate every process (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for task in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*(self._terminate(p) for p in self.processes))

    async def _spawn(self, proc: ManagedProcess) -> None:
        proc.ready.clear()
        with proc.log_path.open("ab") as out:
            proc.process = await asyncio.create_subprocess_exec(
                *proc.spec.argv,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **proc.spec.env},
                start_new_session=True,  # Ctrl-C reaches gpuplane, which stops engines in order
            )
        proc.started_at = self._clock()
        log.info(
            "%s %s (pid %s): %s",
            "restarted" if proc.restarts else "started",
            proc.name,
            proc.pid,
            " ".join(proc.spec.argv),
            extra={
                "event": "engine_restarted" if proc.restarts else "engine_started",
                "instance": proc.name,
                "pid": proc.pid,
                "restarts": proc.restarts,
            },
        )

    async def _start_one(self, proc: ManagedProcess) -> None:
        code = await self._wait_ready(proc)
        if code is not None:
            diagnosis = classify_exit(code, log_tail(proc.log_path))
            raise EngineError(
                f"{proc.name} {diagnosis.cause} while starting: {diagnosis.hint} "
                f"(log: {proc.log_path})"
            )

    async def _watch(self, proc: ManagedProcess) -> None:
        """Restart the process whenever it exits while the supervisor is running."""
        while True:
            assert proc.process is not None
            code = await proc.process.wait()
            if self._stopping:
                return
            proc.ready.clear()
            uptime = self._clock() - proc.started_at
            delay = proc.backoff.after_exit(uptime)
            self._exited(proc, classify_exit(code, log_tail(proc.log_path)), uptime, delay)
            await self._sleep(delay)
            if self._stopping:
                return
            proc.restarts += 1
            await self._spawn(proc)
            try:
                if await self._wait_ready(proc) is None:
                    self.on_status(proc.status(EngineState.RUNNING))
            except EngineError as exc:  # silent: it stays down until it answers or exits
                log.warning("%s", exc, extra={"event": "engine_silent", "instance": proc.name})

    def _exited(
        self, proc: ManagedProcess, diagnosis: ExitDiagnosis, uptime: float, delay: float
    ) -> None:
        """Log and publish an exit after `uptime` seconds up; the restart follows in `delay`."""
        backoff = proc.backoff
        if backoff.crash_looping:
            state = EngineState.CRASH_LOOPING
            what = (
                f"{proc.name} is crash-looping: it exited {backoff.quick_crashes} times in a "
                f"row, each within {backoff.stable_after_s:g} s of starting; the last time "
                f"it {diagnosis.cause}"
            )
        else:
            state = EngineState.RESTARTING
            what = f"{proc.name} {diagnosis.cause} {uptime:.1f} s after it started"
        proc.error = f"{what}: {diagnosis.hint}; next start in {delay:g} s (log: {proc.log_path})"
        log.log(
            logging.ERROR if backoff.crash_looping else logging.WARNING,
            "%s",
            proc.error,
            extra={
                "event": "engine_exited",
                "instance": proc.name,
                "exit": diagnosis.signal or f"code {diagnosis.returncode}",
                "returncode": diagnosis.returncode,
                "restarts": proc.restarts,
                "next_delay_s": delay,
                "state": state.value,
                "log_path": str(proc.log_path),
            },
        )
        self.on_status(proc.status(state))

    async def _wait_ready(self, proc: ManagedProcess) -> int | None:
        """None once the process answers its health path, its return code if it exits first;
        raises `EngineError` when it does neither within `start_timeout_s`."""
        process = proc.process
        assert process is not None
        deadline = time.monotonic() + self.start_timeout_s
        url = proc.url + self.adapter.health_path
        async with httpx.AsyncClient(trust_env=False) as client:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    return process.returncode
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url, timeout=2.0)).status_code < 500:
                        proc.ready.set()
                        log.info("%s is ready at %s", proc.name, proc.url)
                        return None
                with contextlib.suppress(TimeoutError):  # an exit ends the pause early
                    await asyncio.wait_for(process.wait(), 0.25)
        raise EngineError(
            f"{proc.name} did not answer {url} within {self.start_timeout_s:g} s; "
            f"see {proc.log_path}"
        )

    @staticmethod
    async def _terminate(proc: ManagedProcess) -> None:
        p = proc.process
        if p is None or p.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(p.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            await p.wait()
