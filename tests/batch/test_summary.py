"""A run is a record: resumed, it reports and compares like an uninterrupted run; re-run when
finished, it does nothing and leaves its figures as they were."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gpuplane.batch.journal import read_records
from gpuplane.batch.metrics import BusyTimeline
from gpuplane.batch.report import compare_runs
from gpuplane.batch.summary import finite
from gpuplane.cli.batch import app
from tests.helpers.batch import TOY, expected, outputs, strict_json, write_clips


def batch_run(tmp_path: Path, out: str, clips: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """`gpuplane batch run` of the toy pipeline, its own cache per run directory."""
    args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / out),
            "--cache", str(tmp_path / f"cache-{out}"), "--threads", *extra]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code in (0, 1), res.output
    return json.loads((tmp_path / out / "run.json").read_text()), res.output


def journal(run_dir: Path) -> dict[str, dict[str, Any]]:
    return read_records(run_dir / "results.jsonl")


def figures(run: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on how many invocations the run took (times aside)."""
    return {
        "status": run["status"],
        "clips": run["clips"]["done"],
        "failed": run["clips"]["errors"],
        "stages": {n: (s["computed"], s["cached"], s["cache"]["hits"], s["cache"]["misses"],
                       s["cache"]["writes"]) for n, s in run["stages"].items()},
        "aggregate": run["aggregate"],
    }  # fmt: skip


def same_answer(base: Path, a: Path, b: Path) -> None:
    """`batch compare` of `base` against `a` and against `b` agree, times aside."""
    ca, cb = compare_runs(base, a), compare_runs(base, b)
    for c in (ca, cb):
        for st in c["stages"].values():
            del st["device_s"]
    assert (ca["stages"], ca["clips"], ca["changed_results"]) == (
        cb["stages"], cb["clips"], cb["changed_results"])  # fmt: skip


def test_a_run_stopped_early_then_resumed_records_what_an_uninterrupted_run_does(
    tmp_path: Path,
) -> None:
    clips = write_clips(tmp_path / "clips", 12)
    first, _ = batch_run(tmp_path, "resumed", clips, "--limit", "5")
    assert first["clips"]["done"] == 5
    resumed, out = batch_run(tmp_path, "resumed", clips)
    assert "clips: 7 done, 5 already done" in out
    assert "run: 12 clips done over 2 invocations" in out
    whole, _ = batch_run(tmp_path, "whole", clips)
    assert figures(resumed) == figures(whole)
    assert figures(resumed)["stages"]["perception"][:2] == (12, 0)
    assert outputs(tmp_path / "resumed") == outputs(tmp_path / "whole") == expected(clips)
    assert [(e["invocation"], e["done"]) for e in resumed["invocations"]] == [(1, 5), (2, 7)]
    by_clip = journal(tmp_path / "resumed")
    assert by_clip["clip-0004"]["invocation"] == 1
    assert by_clip["clip-0005"]["invocation"] == 2
    assert set(by_clip["clip-0005"]["t"]) == {"perception", "size_check", "sum_check",
                                              "parity_check"}  # fmt: skip
    report = (tmp_path / "resumed" / "report.html").read_text()
    assert "<tr><td>clips done</td><td>12</td></tr>" in report
    assert "<tr><td>perception</td><td>1</td><td>12</td><td>0</td>" in report
    batch_run(tmp_path, "base", clips, "--stage-version", "sum_check=2")
    same_answer(tmp_path / "base", tmp_path / "resumed", tmp_path / "whole")


def test_a_run_stopped_by_a_failing_clip_then_resumed_counts_its_attempts(
    tmp_path: Path,
) -> None:
    clips = write_clips(tmp_path / "clips", 6, broken=(2,))
    first, out = batch_run(tmp_path, "resumed", clips)
    assert "1 clips failed" in out
    assert (first["status"], first["clips"]["errors"]) == ("finished_with_errors", 1)
    (clips / "clip-0002.bin").write_bytes(b"fixed now")
    resumed, out = batch_run(tmp_path, "resumed", clips)
    assert "clips: 1 done, 5 already done" in out
    whole, _ = batch_run(tmp_path, "whole", clips)
    assert figures(resumed) == figures(whole)
    assert resumed["stages"]["perception"]["errors"] == 1  # the failed attempt stays on record
    records = journal(tmp_path / "resumed")
    assert (records["clip-0002"]["invocation"], records["clip-0002"]["attempts"]) == (2, 2)
    assert (records["clip-0001"]["invocation"], records["clip-0001"]["attempts"]) == (1, 1)
    assert [(e["done"], e["errors"]) for e in resumed["invocations"]] == [(5, 1), (1, 0)]
    batch_run(tmp_path, "base", clips, "--stage-version", "parity_check=2")
    same_answer(tmp_path / "base", tmp_path / "resumed", tmp_path / "whole")


def test_rerunning_a_finished_run_does_nothing_and_leaves_its_record_intact(
    tmp_path: Path,
) -> None:
    clips = write_clips(tmp_path / "clips", 12)
    batch_run(tmp_path, "run", clips)
    run_json = (tmp_path / "run" / "run.json").read_text()
    report = (tmp_path / "run" / "report.html").read_text()
    again, out = batch_run(tmp_path, "run", clips)
    assert "nothing to do, 12 clips already done" in out
    assert (tmp_path / "run" / "run.json").read_text() == run_json
    assert again["clips"] == {"done": 12, "errors": 0, "invocations": 1}

    def tables(html: str) -> str:  # the plots carry their render time
        return re.sub(r"<svg.*?</svg>", "", html, flags=re.S)

    assert tables((tmp_path / "run" / "report.html").read_text()) == tables(report)
    batch_run(tmp_path, "other", clips)
    cmp = compare_runs(tmp_path / "other", tmp_path / "run")
    assert cmp["totals"]["throughput_clips_per_s"]["b"] > 0
    assert all(s["computed"] == [12, 12] for s in cmp["stages"].values())


def test_an_error_line_torn_by_a_kill_does_not_block_the_resume(tmp_path: Path) -> None:
    clips = write_clips(tmp_path / "clips", 3, broken=(1,))
    batch_run(tmp_path, "run", clips)
    errors = tmp_path / "run" / "errors.jsonl"
    errors.write_text(errors.read_text() + '{"clip": "clip-00')
    (clips / "clip-0001.bin").write_bytes(b"fixed now")
    resumed, out = batch_run(tmp_path, "run", clips)
    assert "clips: 1 done, 2 already done" in out
    assert resumed["clips"] == {"done": 3, "errors": 0, "invocations": 2}
    assert journal(tmp_path / "run")["clip-0001"]["attempts"] == 2


def test_a_resumed_timeline_lays_the_new_work_after_the_earlier() -> None:
    earlier = BusyTimeline(100.0, bin_s=0.5)
    earlier.add("gpu0", 100.0, 101.0, 1.0)  # the first invocation: busy its first second
    later = BusyTimeline.resume(earlier.to_dict(), 200.0 - 2.0)  # started at 200 s, 2 s already run
    later.add("gpu0", 200.0, 200.5, 0.5)
    assert later.to_dict()["utilisation"]["gpu0"] == [1.0, 1.0, 0.0, 0.0, 0.5]


def test_run_json_is_strict_json_when_a_stage_is_planned_as_free(tmp_path: Path) -> None:
    clips = write_clips(tmp_path / "clips", 3)
    batch_run(tmp_path, "run", clips)
    # the same cache again: every stage is expected to hit, its planned rate is unbounded
    args = ["run", TOY, "--clips", str(clips), "--out", str(tmp_path / "again"),
            "--cache", str(tmp_path / "cache-run"), "--threads", "-o", "json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    run = strict_json((tmp_path / "again" / "run.json").read_text())
    assert strict_json(res.output)["plan"] == run["plan"]
    assert set(run["plan"]["rates"].values()) == {None}
    assert any("rate unbounded" in n for n in run["plan"]["notes"])


def test_a_metric_json_cannot_hold_is_null_with_a_note() -> None:
    doc = {"aggregate": {"min_ttc_s": float("inf"), "n": 3}, "rows": [1.0, float("nan")]}
    clean, nulls = finite(doc)
    assert clean == {"aggregate": {"min_ttc_s": None, "n": 3}, "rows": [1.0, None]}
    assert nulls == {"aggregate.min_ttc_s": "inf (JSON has no infinity)",
                     "rows[1]": "nan (JSON has no NaN)"}  # fmt: skip
