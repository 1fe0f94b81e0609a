"""The local runner: pinned per-card pools on GPU machines, one CPU pool otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import CPU, ModuleProfile, declared_devices, plan_packing
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.runners.base import Task, WorkerSpec
from gpuplane.batch.runners.local import LocalRunner, detect_gpus
from tests.helpers.batch import TOY


def test_pinned_pools_see_only_their_card() -> None:
    pipe = load_pipeline(TOY)
    mods = [ModuleProfile(s.name, s.slice, 0.1) for s in pipe.stages]
    plan = plan_packing(mods, declared_devices(2), max_replicas=2)
    runner = LocalRunner(cpu_slots=1, pin_devices=True)
    runner.start(WorkerSpec(TOY), plan, pipe)
    try:
        assert runner.capacity == len(plan.replicas) - plan.replica_counts["parity_check"] + 1
        a_out = {"sum": 10, "n": 4}
        futures = [
            (r, runner.submit(Task("c", r.module, None, (a_out,)), r))
            for r in plan.replicas
            if r.module != "perception"
        ]
        for r, fut in futures:
            res = fut.result(timeout=120)
            want = "" if r.device == CPU else r.device.removeprefix("gpu")
            assert res.worker.endswith(f":cuda[{want}]"), (r, res.worker)
    finally:
        runner.stop()
    runner.stop()  # idempotent


def test_threads_cannot_pin_and_no_nvidia_smi_means_no_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(BatchError, match="drop --threads"):
        LocalRunner(threads=True, pin_devices=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == ()
