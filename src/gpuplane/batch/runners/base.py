"""The runner interface (where stage tasks execute) and the worker side every runner shares.

The driver (`gpuplane.batch.driver`, over `flow` and `prefetch`) owns scheduling, the cache
reads, resume and the record; a runner only executes `Task`s on the replicas the plan names.
Call order: `start(spec, plan)` once, then any number of `submit(task, replica)` (at most
`capacity` in flight), then `stop()` (idempotent, also after a failed start).
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gpuplane.batch.cache import StageCache
from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import PackingPlan, Replica
from gpuplane.batch.pipeline import BoundStage, Pipeline, load_pipeline


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs to rebuild the pipeline and reach the cache in its own process."""

    pipeline_spec: str | None
    versions: Mapping[str, str] = field(default_factory=dict)
    cache_url: str | None = None
    cache_options: Mapping[str, Any] = field(default_factory=dict)
    blas_threads: int | None = 1


@dataclass(frozen=True, slots=True)
class Task:
    """One stage on one clip. `key` is None when the result is not to be cached."""

    clip: str
    stage: str
    key: str | None
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class TaskResult:
    value: Any
    start: float  # wall clock (time.time) in the worker, comparable across processes
    end: float
    bytes_written: int
    worker: str


class Worker:
    """Runs tasks in one process: its own bound stages (class stages built once) and cache."""

    def __init__(self, spec: WorkerSpec, pipeline: Pipeline | None = None) -> None:
        if spec.blas_threads is not None:
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                os.environ.setdefault(var, str(spec.blas_threads))
        if pipeline is None:
            if spec.pipeline_spec is None:
                raise BatchError("a worker in another process needs the pipeline's spec (path)")
            pipeline = load_pipeline(spec.pipeline_spec, spec.versions)
        self.pipeline = pipeline
        self.cache = (
            StageCache(spec.cache_url, dict(spec.cache_options)) if spec.cache_url else None
        )
        self._bound = {s.name: BoundStage(s) for s in pipeline.stages}
        self._locks = {s.name: threading.Lock() for s in pipeline.stages}
        self.ident = f"{socket.gethostname()}:{os.getpid()}"

    def run(self, task: Task) -> TaskResult:
        bound = self._bound[task.stage]
        start = time.time()
        if bound.stage.is_class:
            with self._locks[task.stage]:  # one instance per worker; calls are serialised
                value = bound(*task.args)
        else:
            value = bound(*task.args)
        end = time.time()
        written = 0
        if task.key is not None and self.cache is not None:
            written = self.cache.put(task.stage, bound.stage.version, task.key, value)
        return TaskResult(value, start, end, written, self.ident)


class Runner(ABC):
    """Executes tasks on the replicas of a packing plan."""

    name: str = "base"

    @property
    @abstractmethod
    def capacity(self) -> int:
        """How many tasks may be in flight at once (the driver never submits more)."""

    @abstractmethod
    def start(self, spec: WorkerSpec, plan: PackingPlan, pipeline: Pipeline) -> None:
        """Create pools or actors for every replica of `plan`."""

    @abstractmethod
    def submit(self, task: Task, replica: Replica) -> Future[TaskResult]:
        """Run `task` on `replica`; the future carries its result or error."""

    @abstractmethod
    def stop(self) -> None:
        """Release pools and actors; idempotent."""

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "capacity": self.capacity}


RUNNERS: dict[str, Callable[..., Runner]] = {}


def register(name: str) -> Callable[[type[Runner]], type[Runner]]:
    def wrap(cls: type[Runner]) -> type[Runner]:
        RUNNERS[name] = cls
        cls.name = name
        return cls

    return wrap


def runner_names() -> list[str]:
    """The runners' names, sorted."""
    # importing the modules registers them; ray itself is imported only when a Ray runner starts
    for module in ("local", "ray"):
        importlib.import_module(f"gpuplane.batch.runners.{module}")
    return sorted(RUNNERS)


def make_runner(name: str, **options: Any) -> Runner:
    """Instantiate a runner by name; unknown names fail with the list of valid ones."""
    if name not in runner_names():
        raise BatchError(f"unknown runner {name!r}; choose one of {sorted(RUNNERS)}")
    return RUNNERS[name](**options)
