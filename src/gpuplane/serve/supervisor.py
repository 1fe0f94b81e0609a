"""Start engine processes, wait until they answer, restart the ones that die, stop them all.

The shell around an `EngineAdapter`: the adapter says what to run and where it answers, this
module owns the processes. One asyncio task watches each process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gpuplane.errors import EngineError
from gpuplane.serve.engines.base import EngineAdapter, LaunchSpec

log = logging.getLogger("gpuplane.engine")


@dataclass(slots=True)
class ManagedProcess:
    """One engine instance: its launch spec, its live process and how often it restarted."""

    name: str
    url: str
    spec: LaunchSpec
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None


class Supervisor:
    def __init__(
        self,
        adapter: EngineAdapter,
        instances: list[tuple[str, str, LaunchSpec]],
        *,
        log_dir: Path,
        start_timeout_s: float = 120.0,
        restart_backoff_s: float = 1.0,
    ) -> None:
        self.adapter = adapter
        self.start_timeout_s = start_timeout_s
        self.restart_backoff_s = restart_backoff_s
        log_dir.mkdir(parents=True, exist_ok=True)
        self.processes = [
            ManagedProcess(name, url, spec, log_dir / f"{name}.log")
            for name, url, spec in instances
        ]
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start every instance and wait until all answer their health path."""
        for proc in self.processes:
            await self._spawn(proc)
        self._watchers = [asyncio.create_task(self._watch(p)) for p in self.processes]
        try:
            await asyncio.gather(*(self._wait_ready(p) for p in self.processes))
        except BaseException:
            await self.stop()
            raise

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
        log.info("started %s (pid %s): %s", proc.name, proc.pid, " ".join(proc.spec.argv))

    async def _watch(self, proc: ManagedProcess) -> None:
        """Restart the process whenever it exits while the supervisor is running."""
        while not self._stopping:
            assert proc.process is not None
            code = await proc.process.wait()
            if self._stopping:
                return
            proc.restarts += 1
            log.warning(
                "%s exited with code %s; restarting (restart #%d, log: %s)",
                proc.name,
                code,
                proc.restarts,
                proc.log_path,
            )
            await asyncio.sleep(self.restart_backoff_s)
            await self._spawn(proc)
            with contextlib.suppress(EngineError):
                await self._wait_ready(proc)

    async def _wait_ready(self, proc: ManagedProcess) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        url = proc.url + self.adapter.health_path
        async with httpx.AsyncClient(trust_env=False) as client:
            while time.monotonic() < deadline:
                if proc.process is not None and proc.process.returncode is not None:
                    raise EngineError(
                        f"{proc.name} exited with code {proc.process.returncode} while starting; "
                        f"see {proc.log_path}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url, timeout=2.0)).status_code < 500:
                        proc.ready.set()
                        log.info("%s is ready at %s", proc.name, proc.url)
                        return
                await asyncio.sleep(0.25)
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
