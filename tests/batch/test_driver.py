"""The driver with the local runner: results, cache reuse on a release, corruption, errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuplane.batch.cache import StageCache
from gpuplane.batch.errors import BatchError
from gpuplane.batch.journal import ResultsJournal, read_records
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.report import compare_runs, write_report
from gpuplane.batch.runners.base import make_runner
from tests.helpers.batch import TOY, RunFn, children, expected, outputs, write_clips
from tests.helpers.common import alive


def _stage_workers() -> list[int]:
    """Live child processes of this test process, multiprocessing's resource tracker aside."""
    out = []
    for pid in children():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"resource_tracker" not in cmd and alive(pid):
            out.append(pid)
    return out


@pytest.mark.parametrize("threads", [True, False], ids=["threads", "processes"])
def test_run_computes_every_clip_once_then_serves_from_cache(
    run_toy: RunFn, clips: Path, tmp_path: Path, threads: bool
) -> None:
    runner = make_runner("local", threads=threads, cpu_slots=2)
    first = run_toy("a", runner=runner)
    assert first["status"] == "finished"
    assert outputs(tmp_path / "a") == expected(clips)
    stages = first["stages"]
    assert {n: s["computed"] for n, s in stages.items()} == dict.fromkeys(stages, 12)
    assert stages["perception"]["cache"]["writes"] == 12
    assert first["device_seconds"] > 0
    assert _stage_workers() == []  # the runner stopped its pool: no worker left behind
    second = run_toy("b")
    assert {n: s["cached"] for n, s in second["stages"].items()} == dict.fromkeys(stages, 12)
    assert all(s["computed"] == 0 for s in second["stages"].values())
    assert outputs(tmp_path / "b") == expected(clips)


def test_release_bump_reuses_stage_a(run_toy: RunFn, clips: Path, tmp_path: Path) -> None:
    first = run_toy("a")
    assert first["clips"]["done"] == 12
    log = tmp_path / "calls.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOY_LOG", str(log))
        bumped = run_toy("b", versions={"sum_check": "2", "parity_check": "2"})
    s = bumped["stages"]
    # the planner saw perception's entries before the run and planned it as nearly free
    assert bumped["expected_hit_rate"]["perception"] == 1.0, (bumped, first)
    assert bumped["expected_hit_rate"]["sum_check"] == 0.0
    assert bumped["plan"]["rates"]["perception"] is None  # unbounded: served from cache
    assert "perception: rate unbounded (0 s per clip expected), shown as null" in (
        bumped["plan"]["notes"])  # fmt: skip
    assert s["perception"]["cached"] == 12
    assert s["perception"]["computed"] == 0
    assert s["size_check"]["cached"] == 12
    assert s["sum_check"]["computed"] == 12
    assert s["parity_check"]["computed"] == 12
    calls = [line.split()[0] for line in log.read_text().splitlines()]
    assert sorted(set(calls)) == ["parity_check", "sum_check"]
    assert outputs(tmp_path / "b") == expected(clips)
    cmp = compare_runs(tmp_path / "a", tmp_path / "b")
    assert cmp["clips"]["common"] == 12
    assert cmp["changed_results"] == {}
    assert cmp["stages"]["sum_check"]["version"] == ["1", "2"]


def test_corrupt_stage_a_entry_is_recomputed(run_toy: RunFn, tmp_path: Path) -> None:
    run_toy("a")
    cache = StageCache(str(tmp_path / "cache"))
    entries = [e for e in cache.entries() if e.stage == "perception"]
    victim = Path(entries[0].path)
    victim.write_bytes(victim.read_bytes()[:-5] + b"XXXXX")
    again = run_toy("b")
    p = again["stages"]["perception"]
    assert (p["computed"], p["cached"], p["cache"]["corrupt"]) == (1, 11, 1)
    assert victim.exists()  # rewritten, valid again
    assert cache.get("perception", "1", entries[0].key)[0]


def test_failing_clip_is_reported_and_retried_next_run(tmp_path: Path, run_toy: RunFn) -> None:
    bad = write_clips(tmp_path / "bad", 5, broken=(2,))
    res = run_toy("a", clip_dir=bad)
    assert res["status"] == "finished_with_errors"
    assert res["clips"]["errors"] == 1
    err = [json.loads(x) for x in (tmp_path / "a" / "errors.jsonl").read_text().splitlines()]
    assert err[0]["clip"] == "clip-0002"
    assert err[0]["stage"] == "perception"
    assert "broken on purpose" in err[0]["error"]
    assert sorted(read_records(tmp_path / "a" / "results.jsonl")) == [
        "clip-0000", "clip-0001", "clip-0003", "clip-0004"]  # fmt: skip
    (bad / "clip-0002.bin").write_bytes(b"fixed now")
    res2 = run_toy("a", clip_dir=bad)
    assert res2["invocation"]["skipped_already_done"] == 4
    # the aggregate folds the whole journal: both runs' clips
    sizes = [len(p.read_bytes()) for p in bad.iterdir()]
    assert res2["aggregate"] == {"clips": 5, "bytes": sum(sizes)}
    assert res["aggregate"]["clips"] == 4
    assert res2["invocation"]["done"] == 1
    assert res2["clips"] == {"done": 5, "errors": 0, "invocations": 2}


def test_prefetch_bound_holds_during_a_run(run_toy: RunFn) -> None:
    res = run_toy("a", prefetch_items=2, io_workers=3)
    assert res["invocation"]["prefetch"]["peak_items"] <= 2
    assert res["clips"]["done"] == 12


def test_refuses_to_resume_another_pipeline_version(run_toy: RunFn) -> None:
    run_toy("a")
    with pytest.raises(BatchError, match="another pipeline version"):
        run_toy("a", versions={"perception": "2"})


def test_report_has_the_three_plots(run_toy: RunFn, tmp_path: Path) -> None:
    summary = run_toy("a")
    html = write_report(summary, tmp_path / "a").read_text()
    for title in ("Time per stage", "Device utilisation over time", "Cache hit rate per stage"):
        assert f"<h2>{title}</h2><svg" in html
    util = summary["timeline"]["utilisation"]
    assert set(util) >= {"gpu0"}
    assert all(0 <= v <= 1.0 + 1e-6 for v in util["gpu0"])


def test_journal_truncates_a_torn_line_and_refuses_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"clip":"a","out":1}\n{"clip":"b","ou')
    j = ResultsJournal(path)
    assert "a" in j.done
    assert len(j.done) == 1
    assert j.torn_bytes > 0
    j.append("b", {"out": 2})
    with pytest.raises(BatchError, match="twice"):
        j.append("a", {"out": 3})
    j.close()
    assert [json.loads(x)["clip"] for x in path.read_text().splitlines()] == ["a", "b"]
    path.write_text("not json\n")
    with pytest.raises(BatchError, match="not a journal line"):
        ResultsJournal(path)


def test_unknown_runner_lists_valid_ones() -> None:
    with pytest.raises(BatchError, match=r"\['local', 'ray'\]"):
        make_runner("slurm")
    assert load_pipeline(TOY).name == "toy"


def test_plan_uses_declared_shares_first_then_measured_profile(tmp_path: Path, clips: Path) -> None:
    from gpuplane.batch.clips import list_clips
    from gpuplane.batch.driver import Driver, RunOptions
    from gpuplane.batch.packing import declared_devices
    from gpuplane.batch.runners.base import WorkerSpec

    pipe = load_pipeline(TOY)
    spec = WorkerSpec(TOY, {}, str(tmp_path / "cache"))

    def driver(out: str, calibrate: bool = False) -> Driver:
        opts = RunOptions(tmp_path / out, declared_devices(2), calibrate=calibrate)
        return Driver(pipe, spec, make_runner("local", threads=True, cpu_slots=2), opts)

    first = driver("a").run(list_clips(str(clips)))
    assert first["profile_s"]["perception"] == pytest.approx(0.4)  # its declared share
    stored = StageCache(str(tmp_path / "cache")).load_profile()
    assert set(stored) == {s.name for s in pipe.stages}
    # the journal keeps each clip's seconds to the microsecond
    mean = first["stages"]["perception"]["mean_compute_s"]
    assert stored["perception"] == pytest.approx(mean, abs=1e-6)
    _, profile = driver("b").plan(None)
    assert profile == stored
    fresh = Driver(pipe, WorkerSpec(TOY), make_runner("local", threads=True),
                   RunOptions(tmp_path / "c", declared_devices(1), calibrate=True))  # fmt: skip
    _, timed = fresh.plan(next(iter(list_clips(str(clips)))))
    assert set(timed) == set(stored)
    assert timed != {s.name: 0.4 for s in pipe.stages}


def test_id_set_answers_membership_across_merges() -> None:
    from gpuplane.batch.journal import IdSet

    ids = IdSet()
    for i in range(10_000):
        ids.add(f"clip-{i}")
    assert len(ids) == 10_000
    assert all(f"clip-{i}" in ids for i in range(0, 10_000, 7))
    assert not any(f"clip-{i}" in ids for i in range(10_000, 11_000))
    assert 3 not in ids


def test_a_failing_reduction_fails_that_clip_only(run_toy: RunFn, tmp_path: Path) -> None:
    import dataclasses

    from tests.batch import toy_pipeline

    def reduce(clip_id: str, out: Mapping[str, Any]) -> dict[str, Any]:
        if clip_id == "clip-0003":
            raise KeyError("metric missing")
        return toy_pipeline.reduce(clip_id, out)

    pipe = dataclasses.replace(load_pipeline(TOY), reduce=reduce)
    res = run_toy("a", pipeline=pipe)
    assert res["clips"]["done"] == 11
    assert res["clips"]["errors"] == 1
    err = json.loads((tmp_path / "a" / "errors.jsonl").read_text())
    assert (err["clip"], err["stage"]) == ("clip-0003", "reduce")


def test_a_second_writer_of_one_run_directory_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    first = ResultsJournal(tmp_path / "results.jsonl")
    code = (
        "import sys; from gpuplane.batch.journal import ResultsJournal\n"
        "from pathlib import Path\n"
        "try:\n    ResultsJournal(Path(sys.argv[1]))\n"
        "except Exception as e:\n    print(e); sys.exit(3)\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "results.jsonl")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert other.returncode == 3
    assert "another run is writing" in other.stdout
    first.close()
    ResultsJournal(tmp_path / "results.jsonl").close()  # free again once the first is done
