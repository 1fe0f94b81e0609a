"""`gpuplane batch` end to end on the reference workload: run, release re-run, compare, plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.cli.batch import app
from tests.helpers.batch import clip_table, parse, strict_json

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "drive_eval")


@pytest.fixture(scope="module")
def drive_clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drive") / "clips"
    gen = ROOT / "examples" / "drive_eval" / "generate.py"
    subprocess.run([sys.executable, str(gen), str(out), "--clips", "3"], check=True)
    return out


def test_run_rerun_with_bump_and_compare(drive_clips: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    url = f"slowfile://{drive_clips}"
    common = ["--clips", url, "--cache", str(tmp_path / "cache"), "--storage-option",
              "latency_s=0.01", "--cpu-slots", "2"]  # fmt: skip
    a = cli.invoke(app, ["run", EXAMPLE, *common, "--out", str(tmp_path / "a")])
    assert a.exit_code == 0, a.output
    assert "perception" in a.output
    assert "report:" in a.output
    assert "aggregate: clips 3, lane_departures" in a.output
    assert (tmp_path / "a" / "report.html").read_text().count("<svg") >= 3
    head, *rows = clip_table(parse(tmp_path / "a" / "report.html"))
    assert len(rows) == 3
    assert "lane_rules.departures (reduced)" in head  # a stage's dict output, a column per key
    run = strict_json((tmp_path / "a" / "run.json").read_text())  # no Infinity from a metric
    # no obstacle ahead in these clips: the minimum time to collision is infinite
    assert run["aggregate"]["min_ttc_s"] is None
    assert run["nulls"] == {"aggregate.min_ttc_s": "inf (JSON has no infinity)"}
    b = cli.invoke(
        app,
        ["run", EXAMPLE, *common, "--out", str(tmp_path / "b"), "-o", "json",
         "--stage-version", "lane_rules=2", "--stage-version", "planning_check=2"],
    )  # fmt: skip
    assert b.exit_code == 0, b.output
    doc = json.loads(b.output)
    assert doc["stages"]["perception"]["cached"] == 3
    assert doc["stages"]["perception"]["computed"] == 0
    assert doc["stages"]["lane_rules"]["computed"] == 3
    assert doc["stages"]["obstacle_rules"]["cached"] == 3
    cmp = cli.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert cmp.exit_code == 0, cmp.output
    assert "1 → 2" in cmp.output
    assert "clips in both: 3" in cmp.output


def test_plan_prints_replicas_and_bad_input_says_what_to_do(
    drive_clips: Path, tmp_path: Path
) -> None:
    cli = CliRunner()
    cache = ["--cache", str(tmp_path / "cache"), "--calibrate"]  # time perception, the heavy one
    res = cli.invoke(app, ["plan", EXAMPLE, "--clips", str(drive_clips), *cache, "-o", "json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert set(plan["replicas"]) >= {"perception", "lane_rules", "localization_check"}
    assert plan["bottleneck"] == "perception"
    assert all(v <= 1.0 + 1e-9 for v in plan["device_load"].values())
    table = cli.invoke(app, ["plan", EXAMPLE, "--clips", str(drive_clips), *cache])
    assert "packing plan" in table.output
    bad = cli.invoke(app, ["run", EXAMPLE, "--clips", str(drive_clips), "--stage-version", "x"])
    assert bad.exit_code == 2
    assert "KEY=VALUE" in bad.output
    missing = cli.invoke(app, ["run", EXAMPLE, "--clips", "/nonexistent/clips"])
    assert missing.exit_code == 2
    assert "does not exist" in missing.output


def test_progress_shows_every_stage_on_a_terminal(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from gpuplane.batch.clips import list_clips
    from gpuplane.batch.driver import Driver, RunOptions
    from gpuplane.batch.packing import declared_devices
    from gpuplane.batch.pipeline import load_pipeline
    from gpuplane.batch.runners.base import WorkerSpec, make_runner
    from gpuplane.cli.batch_drive import RichObserver
    from tests.helpers.batch import TOY, write_clips

    clips = write_clips(tmp_path / "clips", 4)
    buf = io.StringIO()
    obs = RichObserver(Console(file=buf, force_terminal=True, width=120), enabled=True)
    opts = RunOptions(tmp_path / "run", declared_devices(1))
    runner = make_runner("local", threads=True, cpu_slots=1)
    try:
        Driver(load_pipeline(TOY), WorkerSpec(TOY), runner, opts, obs).run(
            list_clips(str(clips)), total=4
        )
    finally:
        obs.stop()
    text = buf.getvalue()
    for name in ("clips", "perception", "size_check", "sum_check", "parity_check"):
        assert name in text
    assert "4/4" in text
    assert "clips/s" in text  # the rate
    assert "eta" in text


def test_failed_clips_exit_non_zero_and_say_how_to_retry(tmp_path: Path) -> None:
    from tests.helpers.batch import TOY, write_clips

    clips = write_clips(tmp_path / "clips", 3, broken=(1,))
    args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / "run"),
            "--cache", str(tmp_path / "cache"), "--threads", "--no-report"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1
    assert "1 clips failed" in res.output
    assert "errors.jsonl" in res.output
    assert "2 done" in res.output


@pytest.mark.timeout(60)  # ray.init alone retries an unreachable address for minutes
def test_ray_runner_without_a_cluster_at_the_address_says_what_to_do(tmp_path: Path) -> None:
    import socket

    from tests.helpers.batch import TOY, write_clips

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port on 127.0.0.1 that nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clips = write_clips(tmp_path / "clips", 2)
    args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / "run"), "--runner", "ray",
            "--ray-address", f"127.0.0.1:{port}", "--cache", str(tmp_path / "cache")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # the console wraps long lines
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in text
    assert "ray start --head" in text
    assert "--runner local" in text


def test_plan_gives_the_replicas_the_run_uses_and_says_why(
    drive_clips: Path, tmp_path: Path
) -> None:
    """`batch plan` resolves the stages' seconds per clip as `batch run` does (an earlier run's
    measurements, --calibrate, or the declared slices), so with the same options both give the
    same replicas; it says which basis it used."""
    cli = CliRunner()
    common = ["--clips", str(drive_clips), "--cache", str(tmp_path / "cache")]
    planned = cli.invoke(app, ["plan", EXAMPLE, *common, "-o", "json"])
    assert planned.exit_code == 0, planned.output
    run = cli.invoke(app, ["run", EXAMPLE, *common, "--out", str(tmp_path / "a"), "-o", "json"])
    assert run.exit_code == 0, run.output
    ran = json.loads((tmp_path / "a" / "run.json").read_text())
    assert json.loads(planned.stdout)["replicas"] == ran["plan"]["replicas"]
    assert json.loads(planned.stdout)["profile_source"] == "declared shares"
    timed = cli.invoke(app, ["plan", EXAMPLE, "--clips", str(drive_clips), "--calibrate"])
    assert timed.exit_code == 0, timed.output
    assert "seconds per clip: timed on one clip" in timed.output
    after = cli.invoke(app, ["plan", EXAMPLE, *common])  # the run measured its stages
    assert "seconds per clip: measured by earlier runs; expected cache hits: " in after.output
