"""A killed run, started again with the same command, skips finished clips; none lost or doubled."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuplane.batch.journal import read_records
from gpuplane.batch.report import write_report
from tests.helpers.batch import TOY, children, expected, write_clips
from tests.helpers.common import alive


@pytest.mark.slow
def test_sigkilled_run_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    clips = write_clips(tmp_path / "clips", 12)
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "gpuplane.cli.batch", "run", TOY, "--clips", str(clips),
        "--out", str(out), "--cache", str(tmp_path / "cache"), "--cpu-slots", "2",
        "--prefetch-items", "3", "--no-report", "-o", "json",
    ]  # fmt: skip
    env = os.environ | {"TOY_SLEEP_S": "0.3", "TOY_LOG": str(tmp_path / "calls.log")}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    journal = out / "results.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if journal.exists() and journal.read_text().count("\n") >= 3:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        else:
            raise AssertionError("the first run never finished 3 clips")
        workers = children(proc.pid)
        assert workers  # the local runner's process pool
        os.kill(proc.pid, signal.SIGKILL)  # only the driver, as an OOM killer would
        proc.wait()
        # orphaned workers notice their driver is gone and exit on their own
        deadline = time.monotonic() + 60
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in workers if alive(p)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group we started
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    done_at_kill = set(read_records(journal))
    assert 3 <= len(done_at_kill) < 12

    env["TOY_SLEEP_S"] = "0"
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["invocation"]["skipped_already_done"] == len(done_at_kill)
    assert summary["invocation"]["done"] == 12 - len(done_at_kill)
    perception = summary["stages"]["perception"]
    assert perception["computed"] + perception["cached"] == 12  # the run's, both invocations'
    first, last = summary["invocations"]
    assert (first["status"], first["done"], last["done"]) == ("interrupted", len(done_at_kill),
                                                              12 - len(done_at_kill))  # fmt: skip

    assert "<td>interrupted</td>" in write_report(summary, out).read_text()

    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    ids = [x["clip"] for x in lines]
    assert len(ids) == len(set(ids)) == 12  # every clip once, none twice
    assert {x["clip"]: x["out"] for x in lines} == expected(clips)
