"""A batch run's Prometheus metrics: what a run did, per stage, in names promtool accepts."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpuplane.batch.clips import list_clips
from gpuplane.batch.driver import Driver, RunOptions
from gpuplane.batch.exporter import BatchExporter
from gpuplane.batch.packing import declared_devices
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.runners.base import WorkerSpec, make_runner
from gpuplane.cli.batch import app
from tests.helpers.batch import TOY, write_clips


def values(page: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page.decode())
        for s in family.samples
    }


def test_a_run_exports_clips_and_per_stage_outcomes(tmp_path: Path) -> None:
    clips = write_clips(tmp_path / "clips", 3, broken=(1,))
    exporter = BatchExporter("toy")
    opts = RunOptions(tmp_path / "run", declared_devices(1))
    runner = make_runner("local", threads=True, cpu_slots=1)
    Driver(load_pipeline(TOY), WorkerSpec(TOY), runner, opts, exporter).run(
        list_clips(str(clips)), total=3
    )
    page = generate_latest(exporter.registry)
    got = values(page)
    toy = (("pipeline", "toy"),)
    assert got[("gpuplane_batch_clips", toy)] == 3
    assert got[("gpuplane_batch_clips_done_total", toy)] == 2  # the broken clip is not done
    perception = (("outcome", "error"), ("pipeline", "toy"), ("stage", "perception"))
    assert got[("gpuplane_batch_stage_clips_total", perception)] == 1
    computed = (("outcome", "computed"), ("pipeline", "toy"), ("stage", "size_check"))
    assert got[("gpuplane_batch_stage_clips_total", computed)] == 2
    assert got[("gpuplane_batch_stage_device_seconds_total", (*toy, ("stage", "perception")))] > 0
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run(
            [promtool, "check", "metrics"], input=page, capture_output=True, timeout=60
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_busy_metrics_port_is_refused_before_the_run(tmp_path: Path) -> None:
    clips = write_clips(tmp_path / "clips", 1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / "run"), "--threads",
                "--no-report", "--metrics-port", str(port)]  # fmt: skip
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert f"--metrics-port {port}: cannot listen" in res.output
    assert not (tmp_path / "run").exists()


def test_the_endpoint_stops_with_the_run(tmp_path: Path) -> None:
    clips = write_clips(tmp_path / "clips", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / "run"), "--threads",
            "--no-report", "--metrics-port", str(port)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
