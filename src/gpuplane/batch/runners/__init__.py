"""Batch runners: one module per backend (local pools, Ray), one interface in `base`."""

from gpuplane.batch.runners.base import RUNNERS, Runner, Task, TaskResult, WorkerSpec, make_runner

__all__ = ["RUNNERS", "Runner", "Task", "TaskResult", "WorkerSpec", "make_runner"]
