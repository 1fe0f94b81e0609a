"""Fixtures of the batch tests: toy clips on disk, the toy pipeline's path, a run helper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuplane.batch.clips import list_clips
from gpuplane.batch.driver import Driver, RunOptions
from gpuplane.batch.packing import declared_devices
from gpuplane.batch.pipeline import Pipeline, load_pipeline
from gpuplane.batch.runners.base import Runner, WorkerSpec, make_runner
from tests.helpers.batch import TOY, RunFn, write_clips


@pytest.fixture(autouse=True)
def _in_a_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch test runs in its own temp dir: the commands' defaults (batch.cache_url
    `.gpuplane/cache`, batch.runs_dir) are relative to the working directory, which would
    otherwise be the checkout, where the next `make run` would find the toy stages' cache."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def clips(tmp_path: Path) -> Path:
    return write_clips(tmp_path / "clips", 12)


@pytest.fixture
def run_toy(tmp_path: Path, clips: Path) -> RunFn:
    """Run the toy pipeline over `clips` with the local runner (threads unless told)."""

    def run(
        out: str = "run",
        versions: dict[str, str] | None = None,
        runner: Runner | None = None,
        clip_dir: Path | None = None,
        pipeline: Pipeline | None = None,
        **opts: Any,
    ) -> dict[str, Any]:
        versions = versions or {}
        pipe = pipeline or load_pipeline(TOY, versions)
        spec = WorkerSpec(TOY, versions, str(tmp_path / "cache"))
        run_opts = RunOptions(
            out_dir=tmp_path / out,
            devices=declared_devices(2),
            profile={s.name: 0.01 for s in pipe.stages},
            **opts,
        )
        runner = runner or make_runner("local", threads=True, cpu_slots=2)
        drv = Driver(pipe, spec, runner, run_opts)
        return drv.run(list_clips(str(clip_dir or clips)))

    return run
