"""The local runner: tasks on process pools (or threads) on this machine.

Without GPUs, declared devices are an inventory, not hardware: a stage "on gpu1 at 0.25" runs on
a host core, and the plan's replicas bound how many of its tasks run at once. Then one pool of
`cpu_slots` workers (default: the machine's cores) runs everything, because that is how many
tasks the host can truly run side by side; device-seconds are accounted from the plan's shares.

With real GPUs (`pin_devices=True`, what the CLI picks when `nvidia-smi` lists cards), each card
gets its own pool, one worker per replica placed on it, started with `CUDA_VISIBLE_DEVICES` set
to that card, so packed modules share the card the plan gave them; CPU-only modules run on the
`cpu_slots` pool with no card visible.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import CPU, BatchDevice, PackingPlan, Replica
from gpuplane.batch.pipeline import Pipeline
from gpuplane.batch.runners.base import Runner, Task, TaskResult, Worker, WorkerSpec, register

_WORKER: Worker | None = None


def _exit_with_parent(parent: int) -> None:
    """A worker whose driver was killed (SIGKILL leaves no chance to stop the pool) exits too."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _init_process(spec: WorkerSpec, visible: str | None = None) -> None:
    global _WORKER
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _WORKER = Worker(spec)
    if visible is not None:
        _WORKER.ident += f":cuda[{visible}]"


def _run_in_process(task: Task) -> TaskResult:
    if _WORKER is None:  # pragma: no cover - the initializer always ran
        raise BatchError("worker process was not initialised")
    return _WORKER.run(task)


def detect_gpus(timeout_s: float = 10.0) -> tuple[BatchDevice, ...]:
    """The machine's NVIDIA cards as Devices (id gpuN, memory), or () when there are none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ()
    devices = []
    for line in out.splitlines():
        idx, _, mem = line.partition(",")
        if idx.strip().isdigit() and mem.strip().isdigit():
            devices.append(BatchDevice(f"gpu{idx.strip()}", int(mem.strip())))
    return tuple(devices)


@register("local")
class LocalRunner(Runner):
    """Process pools by default; `threads=True` runs in-process (no pickling, shares the GIL)."""

    def __init__(
        self, cpu_slots: int | None = None, threads: bool = False, pin_devices: bool = False
    ) -> None:
        slots = cpu_slots if cpu_slots is not None else (os.cpu_count() or 1)
        if slots < 1:
            raise BatchError(f"cpu slots must be >= 1, got {slots}")
        if threads and pin_devices:
            raise BatchError("pinning tasks to GPUs needs processes: drop --threads")
        self._slots = slots
        self.threads = threads
        self.pin_devices = pin_devices
        self._pool: Executor | None = None
        self._device_pools: dict[str, Executor] = {}
        self._worker: Worker | None = None
        self._capacity = slots

    @property
    def capacity(self) -> int:
        return self._capacity

    def start(self, spec: WorkerSpec, plan: PackingPlan, pipeline: Pipeline) -> None:
        if self.threads or spec.pipeline_spec is None:
            self._worker = Worker(spec, pipeline)
            self._pool = ThreadPoolExecutor(self._slots, thread_name_prefix="stage")
            return
        ctx = multiprocessing.get_context("spawn")
        if not self.pin_devices:
            self._pool = ProcessPoolExecutor(
                self._slots, mp_context=ctx, initializer=_init_process, initargs=(spec,)
            )
            return
        per_device: dict[str, int] = {}
        for r in plan.replicas:
            if r.device != CPU:
                per_device[r.device] = per_device.get(r.device, 0) + 1
        for device, replicas in per_device.items():
            visible = device.removeprefix("gpu")
            self._device_pools[device] = ProcessPoolExecutor(
                replicas, mp_context=ctx, initializer=_init_process, initargs=(spec, visible)
            )
        self._pool = ProcessPoolExecutor(
            self._slots, mp_context=ctx, initializer=_init_process, initargs=(spec, "")
        )
        self._capacity = sum(per_device.values()) + self._slots

    def submit(self, task: Task, replica: Replica) -> Future[TaskResult]:
        if self._pool is None:
            raise BatchError("runner not started: call start() before submit()")
        if self._worker is not None:
            return self._pool.submit(self._worker.run, task)
        pool = self._device_pools.get(replica.device, self._pool)
        return pool.submit(_run_in_process, task)

    def stop(self) -> None:
        pools = [self._pool, *self._device_pools.values()]
        self._pool, self._device_pools = None, {}
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict[str, object]:
        return {
            "runner": self.name,
            "capacity": self._capacity,
            "threads": self.threads,
            "pin_devices": self.pin_devices,
        }
