"""Jobs outlive their control plane: a restarted service (same instance) takes back the jobs that
still run, records the exits that happened while it was down, and fails only those truly gone.

A crash is the service dropped without `close()`: its jobs keep running, as after kill -9. The
last two tests run the real `gpuplane control serve` and send it SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpuplane.control.adapters.base import WorkloadState
from gpuplane.control.adapters.procs import JobRecord, RunDir, process_start
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig
from gpuplane.control.statedir import exclusive
from gpuplane.control.store import queries
from gpuplane.control.store.models import Job
from gpuplane.control.store.store import Store
from tests.control.svc_helpers import (
    assert_no_device_over_allocated,
    config,
    job,
    make_service,
    state,
    wait_state,
)
from tests.helpers.common import free_port

SERVICE_ID = "ctl"


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[ControlConfig]:
    cfg = config(str(tmp_path))
    yield cfg
    # a service of the instance stops the jobs a crashed one left (`no_job_outlives_the_test`)
    make_service(cfg, SERVICE_ID).close()


def crash(service: ControlService) -> None:
    """Drop the service as kill -9 would: its jobs keep running, nothing is recorded."""
    service.store.close()


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def pid_in(path: Path) -> int:
    """The pid a job wrote to `path` once it started."""
    wait_for(lambda: path.exists() and path.read_text().strip() != "", f"{path}")
    return int(path.read_text().split()[0])


def alive(pid: int) -> bool:
    return process_start(pid) is not None


def writes_pid(path: Path, then: str = "exec sleep 60") -> list[str]:
    return ["sh", "-c", f"echo $$ >> {path}; {then}"]


def test_a_running_job_is_adopted_and_its_later_exit_recorded(
    cfg: ControlConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    go = tmp_path / "go"
    command = ["sh", "-c", f"echo started; while [ ! -e {go} ]; do sleep 0.05; done; exit 3"]
    first = make_service(cfg, SERVICE_ID)
    jid = first.submit(job("survivor", command=command, gpus=1))["id"]
    assert state(first, jid).state == "running"
    crash(first)
    with caplog.at_level(logging.INFO, logger="gpuplane.control"):
        second = make_service(cfg, SERVICE_ID)
    try:
        assert "adopted 1 running jobs, recorded 0 exits while down, 0 lost" in caplog.text
        assert state(second, jid).state == "running"
        assert second.adapters["local"].workloads() == [jid]
        assert queries.list_clusters(second)[0].gpus_free == 1  # its card stays taken
        other = second.submit(job("other", gpus=2))["id"]
        assert state(second, other).state == "pending"  # never given a card that is held
        assert_no_device_over_allocated(second)
        wait_for(lambda: b"".join(queries.job_logs(second, jid)) == b"started\n", "its log")
        go.touch()
        row = wait_state(second, jid, "succeeded", "failed")
        assert (row.state, row.exit_code, row.message) == ("failed", 3, "exited with code 3")
        assert wait_state(second, other, "running").state == "running"
    finally:
        second.close()


def test_exits_while_the_service_was_down_are_recorded_with_their_codes(
    cfg: ControlConfig, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_service(cfg, SERVICE_ID)
    ok = first.submit(job("ok", command=["sh", "-c", "sleep 0.2"], gpus=1))["id"]
    bad = first.submit(job("bad", command=["sh", "-c", "sleep 0.2; exit 5"], gpus=1))["id"]
    crash(first)
    adapter = first.adapters["local"]
    wait_for(
        lambda: all(s.state != WorkloadState.RUNNING for s in adapter.status([ok, bad]).values()),
        "both jobs to end",
    )
    with caplog.at_level(logging.INFO, logger="gpuplane.control"):
        second = make_service(cfg, SERVICE_ID)
    try:
        assert "adopted 0 running jobs, recorded 2 exits while down, 0 lost" in caplog.text
        assert (state(second, ok).state, state(second, ok).exit_code) == ("succeeded", 0)
        assert (state(second, bad).state, state(second, bad).exit_code) == ("failed", 5)
        assert queries.list_clusters(second)[0].gpus_free == 2
        assert second.adapters["local"].workloads() == []
    finally:
        second.close()


def test_a_job_whose_wrapper_was_killed_alone_is_stopped_before_its_card_is_freed(
    cfg: ControlConfig, tmp_path: Path
) -> None:
    """The OOM killer may pick the wrapper and spare the job: the job is lost (its exit can no
    longer be known), and what is left of it is stopped before its card goes to another job."""
    pids = tmp_path / "pids"
    service = make_service(cfg, SERVICE_ID)
    try:
        jid = service.submit(job("orphan", command=writes_pid(pids), gpus=2))["id"]
        job_pid = pid_in(pids)
        record = JobRecord.model_validate_json(
            (tmp_path / "clusters" / "local" / "run" / f"{jid}.json").read_bytes()
        )
        os.kill(record.pid, signal.SIGKILL)  # the wrapper alone
        row = wait_state(service, jid, "failed")
        assert row.message is not None
        assert "gone without recording an exit code" in row.message
        assert not alive(job_pid), "the job ran on after its card was freed"
        after = service.submit(job("after", gpus=2))["id"]
        assert wait_state(service, after, "running").state == "running"
        assert_no_device_over_allocated(service)
    finally:
        service.close()


def test_a_live_process_with_the_recorded_pid_but_another_start_time_is_not_adopted(
    cfg: ControlConfig, tmp_path: Path
) -> None:
    first = make_service(cfg, SERVICE_ID)
    jid = first.submit(job("reused", gpus=1))["id"]
    crash(first)
    record_path = RunDir(tmp_path / "clusters" / "local" / "run").files(jid)[0]
    record = JobRecord.model_validate_json(Path(record_path).read_bytes())
    os.killpg(record.pid, signal.SIGKILL)  # the job dies with its wrapper: no exit code
    wait_for(lambda: not alive(record.pid), "the job to die")
    stranger = subprocess.Popen(["sleep", "60"])  # a process the record's pid now names
    try:
        Path(record_path).write_text(
            record.model_copy(update={"pid": stranger.pid}).model_dump_json()
        )
        second = make_service(cfg, SERVICE_ID)
        try:
            row = state(second, jid)
            assert row.state == "failed"
            assert "gone without recording an exit code" in (row.message or "")
            assert stranger.poll() is None, "an unrelated process was taken for the job"
            assert queries.list_clusters(second)[0].gpus_free == 2
        finally:
            second.close()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_job_recorded_before_the_service_id_rename_is_adopted(
    cfg: ControlConfig, tmp_path: Path
) -> None:
    """A run record written when the key was `instance` (an upgrade with jobs running) is read
    as its `service_id`: the restarted service adopts the job, and the record is written anew
    with the new key."""
    pidfile = tmp_path / "pid"
    first = make_service(cfg, SERVICE_ID)
    jid = first.submit(job("sleeper", command=writes_pid(pidfile), gpus=1))["id"]
    pid = pid_in(pidfile)
    crash(first)
    record_path = Path(RunDir(tmp_path / "clusters" / "local" / "run").files(jid)[0])
    old = json.loads(record_path.read_text())
    old["instance"] = old.pop("service_id")
    record_path.write_text(json.dumps(old))
    second = make_service(cfg, SERVICE_ID)
    try:
        assert state(second, jid).state == "running"
        assert alive(pid)
        second.cancel(jid)
        assert not alive(pid)
    finally:
        second.close()


def test_an_adopted_job_can_be_cancelled(cfg: ControlConfig, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    first = make_service(cfg, SERVICE_ID)
    jid = first.submit(job("sleeper", command=writes_pid(pidfile), gpus=1))["id"]
    pid = pid_in(pidfile)
    crash(first)
    second = make_service(cfg, SERVICE_ID)
    try:
        second.cancel(jid)
        assert state(second, jid).state == "cancelled"
        assert not alive(pid)
        assert second.adapters["local"].workloads() == []
    finally:
        second.close()


def test_an_adopted_job_is_still_stopped_at_its_time_limit(
    cfg: ControlConfig, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    first = make_service(cfg, SERVICE_ID)
    spec = {**job("slow", command=writes_pid(pidfile), gpus=1), "time_limit": "1s"}
    jid = first.submit(spec)["id"]
    pid = pid_in(pidfile)
    crash(first)
    second = make_service(cfg, SERVICE_ID)
    try:
        row = wait_state(second, jid, "succeeded", "failed", "cancelled")
        assert row.state == "failed"
        assert "exceeded its time limit" in (row.message or "")
        assert not alive(pid)
    finally:
        second.close()


def test_a_job_cancelled_elsewhere_while_its_service_was_down_is_stopped_at_its_restart(
    cfg: ControlConfig, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    first = make_service(cfg, SERVICE_ID)
    jid = first.submit(job("sleeper", command=writes_pid(pidfile), gpus=1))["id"]
    pid = pid_in(pidfile)
    crash(first)
    other = make_service(cfg, "other")
    try:
        other.cancel(jid)  # not its job: the owner stops it
        assert alive(pid)
        second = make_service(cfg, SERVICE_ID)
        assert not alive(pid)
        assert second.adapters["local"].workloads() == []
        second.close()
    finally:
        other.close()


def test_a_job_bound_just_before_a_crash_is_taken_back_not_started_twice(
    cfg: ControlConfig, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    first = make_service(cfg, SERVICE_ID)
    jid = first.submit(job("once", command=writes_pid(pidfile), gpus=1))["id"]
    pid = pid_in(pidfile)
    with first.store.session() as session, session.begin():  # the crash came before the store
        row = session.get(Job, jid)  # recorded the bind
        assert row is not None
        row.state, row.bound_by, row.started_at = "admitted", None, None
    crash(first)
    second = make_service(cfg, SERVICE_ID)
    try:
        assert wait_state(second, jid, "running").bound_by == SERVICE_ID
        second.tick()
        assert pidfile.read_text().split() == [str(pid)]  # the one process, not a second
        assert alive(pid)
        assert_no_device_over_allocated(second)
    finally:
        second.close()


# -- the real `gpuplane control serve` and its signals ----------------------------------------


class Serve:
    """`gpuplane control serve` on a config file, as an operator runs it."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = workdir / f"serve-{self.port}.log"
        conf = workdir / "gpuplane.yaml"
        control = {
            "service_id": "sig",
            "state_dir": str(workdir / "state"),
            "kill_grace_s": 2.0,
            "allow_root_jobs": True,  # as root: jobs reach the test interpreter (not nobody)
            "clusters": [{"name": "local", "discover_gpus": False}],
            "teams": [{"name": "research"}],
        }
        conf.write_text(yaml.safe_dump({"control": control}))
        cmd = [sys.executable, "-m", "gpuplane.cli.main", "control", "serve"]
        cmd += ["--port", str(self.port), "--config", str(conf), *args]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        for _ in range(1200):
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
            assert self.proc.poll() is None, self.output()
        else:
            raise AssertionError(f"control serve did not come up:\n{self.output()}")
        token = (workdir / "state" / "admin.token").read_text()  # as its admin
        self.http = httpx.Client(
            base_url=self.url, timeout=60, headers={"authorization": f"Bearer {token}"}
        )

    def output(self) -> str:
        return self.out.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.http.close()
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def submit(serve: Serve, spec: dict[str, object]) -> str:
    response = serve.http.post("/jobs", json=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_stop_the_service_not_its_jobs(tmp_path: Path, sig: int) -> None:
    pidfile = tmp_path / "pid"
    serve = Serve(tmp_path)
    again: Serve | None = None
    pid: int | None = None
    try:
        jid = submit(serve, job("sleeper", command=writes_pid(pidfile), gpus=1))
        pid = pid_in(pidfile)
        assert serve.stop(sig) == 0, serve.output()  # a clean shutdown, not killed by the signal
        assert "1 running jobs left running for its restart" in serve.output()
        assert alive(pid)
        again = Serve(tmp_path)
        assert "adopted 1 running jobs" in again.output()
        assert again.http.get(f"/jobs/{jid}").json()["state"] == "running"
        cancelled = again.http.post(f"/jobs/{jid}/cancel").json()
        assert cancelled["state"] == "cancelled"
        assert not alive(pid)
        assert again.stop() == 0
    finally:
        for s in (serve, again):
            if s is not None:
                s.kill()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_stop_jobs_stops_them_on_shutdown_and_records_why(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    serve = Serve(tmp_path, "--stop-jobs")
    try:
        jid = submit(serve, job("sleeper", command=writes_pid(pidfile), gpus=1))
        pid = pid_in(pidfile)
        assert serve.stop() == 0, serve.output()
        assert not alive(pid)
    finally:
        serve.kill()
        if pidfile.exists() and alive(pid_in(pidfile)):
            os.kill(pid_in(pidfile), signal.SIGKILL)
    store = Store.open(f"sqlite:///{tmp_path}/state/control.db")
    try:
        with store.session() as session:
            row = session.get(Job, jid)
            assert row is not None
            assert row.state == "cancelled"  # stopped on purpose: no failure
            assert "stopped when its control plane shut down" in (row.message or "")
    finally:
        store.close()


@pytest.mark.slow
def test_a_second_control_plane_on_the_state_dir_is_refused_and_a_killed_ones_lock_is_not(
    tmp_path: Path,
) -> None:
    """A second `control serve` on the same state dir (another port) is refused before it
    reads or changes anything there, naming the first's pid: the first's job keeps running
    as its own. Once the first is killed (SIGKILL: no clean release), the next start takes the
    dir and the job back; a clean stop frees the dir."""
    pidfile = tmp_path / "pid"
    first = Serve(tmp_path)
    again: Serve | None = None
    pid: int | None = None
    try:
        jid = submit(first, job("sleeper", command=writes_pid(pidfile), gpus=1))
        pid = pid_in(pidfile)
        cmd = [sys.executable, "-m", "gpuplane.cli.main", "control", "serve"]
        cmd += ["--port", str(free_port()), "--config", str(tmp_path / "gpuplane.yaml")]
        second = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        said = " ".join(second.stderr.split())
        assert f"in use by another gpuplane process (pid {first.proc.pid}: " in said, said
        assert "control serve" in said, said
        assert "adopted" not in second.stdout + second.stderr  # it took nothing back
        assert alive(pid)
        assert first.http.get(f"/jobs/{jid}").json()["state"] == "running"
        first.kill()  # SIGKILL: the lock file stays, its lock does not
        again = Serve(tmp_path)
        assert "adopted 1 running jobs" in again.output()
        assert again.http.get(f"/jobs/{jid}").json()["state"] == "running"
        assert again.http.post(f"/jobs/{jid}/cancel").json()["state"] == "cancelled"
        assert again.stop() == 0, again.output()
        with exclusive(str(tmp_path / "state")):
            pass  # released by the clean stop
    finally:
        for s in (first, again):
            if s is not None:
                s.kill()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
