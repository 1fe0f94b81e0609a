"""The local runner: tasks on a process pool (or threads) sized to the host's real CPU slots.

Declared devices are an inventory, not hardware: on a machine without GPUs a stage "on gpu1 at
0.25" runs on a host core, and the plan's replicas bound how many of its tasks run at once. The
pool has `cpu_slots` workers (default: the machine's cores), because that is how many tasks the
host can truly run side by side; device-seconds are accounted from the plan's shares.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

from gpuplane.batch.packing import Placement, Plan
from gpuplane.batch.pipeline import BatchError, Pipeline
from gpuplane.batch.runners.base import Runner, Task, TaskResult, Worker, WorkerSpec, register

_WORKER: Worker | None = None


def _exit_with_parent(parent: int) -> None:
    """A worker whose driver was killed (SIGKILL leaves no chance to stop the pool) exits too."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _init_process(spec: WorkerSpec) -> None:
    global _WORKER
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _WORKER = Worker(spec)


def _run_in_process(task: Task) -> TaskResult:
    if _WORKER is None:  # pragma: no cover - the initializer always ran
        raise BatchError("worker process was not initialised")
    return _WORKER.run(task)


@register("local")
class LocalRunner(Runner):
    """Process pool by default; `threads=True` runs in-process (no pickling, shares the GIL)."""

    def __init__(self, cpu_slots: int | None = None, threads: bool = False) -> None:
        slots = cpu_slots if cpu_slots is not None else (os.cpu_count() or 1)
        if slots < 1:
            raise BatchError(f"cpu slots must be >= 1, got {slots}")
        self._slots = slots
        self.threads = threads
        self._pool: Executor | None = None
        self._worker: Worker | None = None

    @property
    def capacity(self) -> int:
        return self._slots

    def start(self, spec: WorkerSpec, plan: Plan, pipeline: Pipeline) -> None:
        if self.threads or spec.pipeline_spec is None:
            self._worker = Worker(spec, pipeline)
            self._pool = ThreadPoolExecutor(self._slots, thread_name_prefix="stage")
        else:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self._slots, mp_context=ctx, initializer=_init_process, initargs=(spec,)
            )

    def submit(self, task: Task, placement: Placement) -> Future[TaskResult]:
        if self._pool is None:
            raise BatchError("runner not started: call start() before submit()")
        if self._worker is not None:
            return self._pool.submit(self._worker.run, task)
        return self._pool.submit(_run_in_process, task)

    def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict[str, object]:
        return {"runner": self.name, "capacity": self._slots, "threads": self.threads}
