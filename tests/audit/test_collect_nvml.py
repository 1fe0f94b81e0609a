"""The NVML collector on recorded NVML answers: per-process memory and SM share, by workload."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuplane.audit.collect import CollectError, nvml
from gpuplane.audit.sample_store import SampleStore
from gpuplane.cli.main import app
from gpuplane.control.adapters.procs import JobRecord, process_start

ANSWERS = Path(__file__).with_name("nvml")
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
JOB = nvml.Owner("job-7", team="vision", kind="batch", alloc_mem_mib=20480, alloc_cores_pct=50)


def answer(name: str = "two_a100s.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ANSWERS / name).read_text())
    return data


def by_workload(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["card"][:12], r["workload"]): r for r in rows}


def test_processes_are_summed_per_workload_and_unclaimed_ones_keep_their_pid() -> None:
    owners = {4101: JOB, 4188: JOB}  # the job's process and its child
    rows = nvml.samples(answer(), NOW, "c1", "node-a", owners.get).to_pylist()
    got = by_workload(rows)
    assert set(got) == {
        ("GPU-5e2b1c3a", "job-7"),
        ("GPU-5e2b1c3a", "pid:5230"),
        ("GPU-a0b1c2d3", ""),
        ("GPU-0f1e2d3c", "pid:6001"),
    }
    job = got[("GPU-5e2b1c3a", "job-7")]
    assert job["mem_used_mib"] == 10240 + 2048
    # mean of each process's samples, summed: (30+40)/2 % + 5 %
    assert job["compute_share"] == pytest.approx(0.40)
    assert (job["alloc_mem_mib"], job["alloc_cores_pct"], job["team"]) == (20480, 50, "vision")
    assert (job["card_mem_mib"], job["gpu_model"], job["node"]) == (
        81920,
        "NVIDIA A100-SXM4-80GB",
        "node-a",
    )
    stranger = got[("GPU-5e2b1c3a", "pid:5230")]
    assert stranger["compute_share"] == pytest.approx(0.20)
    assert stranger["alloc_mem_mib"] is None  # nobody allocated it: unknown
    free = got[("GPU-a0b1c2d3", "")]
    assert (free["mem_used_mib"], free["compute_share"]) == (4.0, 0.0)


def test_memory_nvml_cannot_report_is_unknown_and_no_sample_means_no_compute() -> None:
    rows = nvml.samples(answer(), NOW, "c1", "n", lambda pid: None).to_pylist()
    held = by_workload(rows)[("GPU-0f1e2d3c", "pid:6001")]
    assert held["mem_used_mib"] is None
    assert held["compute_share"] == 0.0


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    """A session leader with one child, as the local adapter starts a job."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"],
        start_new_session=True,
    )
    yield proc
    import os
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def children(pid: int) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if text:
            return [int(t) for t in text]
        time.sleep(0.02)
    raise AssertionError("the child did not start")


def write_record(run_dir: Path, job_id: str, pid: int, start: str, env: dict[str, str]) -> None:
    record = JobRecord(
        job_id=job_id,
        instance="host:8080",
        pid=pid,
        start_time=start,
        started=0.0,
        limit_s=None,
        placement={"node": "n0", **env},
    )
    (run_dir / f"{job_id}.json").write_text(record.model_dump_json())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc")
def test_a_process_belongs_to_the_job_whose_recorded_process_leads_its_session(
    tmp_path: Path, leader: subprocess.Popen[bytes]
) -> None:
    [child] = children(leader.pid)
    start = process_start(leader.pid)
    assert start is not None
    limits = {"CUDA_DEVICE_MEMORY_LIMIT": "10240m", "CUDA_DEVICE_SM_LIMIT": "25"}
    write_record(tmp_path, "job-live", leader.pid, start, limits)
    write_record(tmp_path, "job-gone", 1, "ticks:0", {})  # pid 1 now is someone else
    (tmp_path / "torn.json").write_text("{")
    resolve = nvml.run_dir_resolver(tmp_path)
    owner = resolve(child)
    assert owner == nvml.Owner("job-live", kind="batch", alloc_mem_mib=10240, alloc_cores_pct=25)
    assert resolve(leader.pid) == owner
    assert resolve(1) is None
    assert resolve(2**22 + 7) is None  # no such process


class FakePynvml(types.ModuleType):
    """Stands in for `pynvml` where no GPU is (this machine): it answers NVML's calls from a
    recorded answer with pynvml's own return shapes (struct-like objects with the same fields,
    lists of them, NVMLError for NOT_FOUND), so `Reader.answer()` runs as on a GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, recorded: dict[str, Any]) -> None:
        super().__init__("pynvml")
        self.recorded = recorded
        self.asked_since: list[int] = []
        self.shut = False

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.recorded["driver"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.recorded["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        dev: dict[str, Any] = self.recorded["devices"][index]
        return dev

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        return str(h["uuid"])

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> bytes:
        return str(h["name"]).encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> types.SimpleNamespace:
        return types.SimpleNamespace(**h["memory"])

    def nvmlDeviceGetUtilizationRates(self, h: dict[str, Any]) -> types.SimpleNamespace:
        return types.SimpleNamespace(**h["utilization"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[Any]:
        return [types.SimpleNamespace(**p) for p in h["processes"]]

    def nvmlDeviceGetProcessUtilization(self, h: dict[str, Any], since: int) -> list[Any]:
        self.asked_since.append(since)
        fresh = [s for s in h["process_utilization"] if s["timeStamp"] > since]
        if not fresh:
            raise self.NVMLError("Not Found")
        return [types.SimpleNamespace(**s) for s in fresh]


def test_the_reader_returns_pynvml_answers_in_the_recorded_shape_and_moves_its_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakePynvml(answer())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = nvml.Reader()
    first = reader.answer()
    assert first == answer()
    second = reader.answer()  # only samples newer than the last pass's newest
    assert fake.asked_since[-1] == 1764633600266000
    assert all(d["process_utilization"] == [] for d in second["devices"])
    reader.close()
    reader.close()  # idempotent
    assert fake.shut


def test_cli_collects_one_pass_and_records_the_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(answer()))
    out, rec = tmp_path / "samples", tmp_path / "answer.json"
    args = ["audit", "collect", "-s", "nvml", "--once", "--out", str(out), "--node", "gpu-1"]
    result = CliRunner().invoke(app, [*args, "--record", str(rec)])
    assert result.exit_code == 0, result.output
    # no --run-dir: each process is its own workload
    assert SampleStore(out).scan().num_rows == 5
    assert json.loads(rec.read_text()) == answer()


def test_without_a_driver_the_collector_says_what_to_do_instead() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # any failure means no usable driver here
        with pytest.raises(CollectError, match=r"NVML is not available here.*--source prometheus"):
            nvml.Reader()
    else:  # pragma: no cover - a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
