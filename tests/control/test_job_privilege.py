"""Jobs run with least privilege (issue 23): a job sees none of the service's environment, runs
as an unprivileged user when the service is root, and cannot read or write the state dir.

The commands are `/bin/sh` and `/usr/bin/env`, which any user can run: the test interpreter may
live where `nobody` cannot reach it (here, under /root).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.adapters import AdapterError
from gpuplane.control.adapters._privilege import MINIMAL_PATH, TeamUids, can_run, job_user
from gpuplane.control.deployments.routes import describe
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig
from gpuplane.control.spec import SpecError
from gpuplane.control.store import queries
from gpuplane.control.store.models import Deployment
from tests.control.svc_helpers import job, least_privilege, make_service, wait_state

SECRET = "s3cr3t-from-the-service-env"
UIDS = TeamUids(ControlConfig().team_uid_start, ControlConfig().team_uid_count)
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs the service as root")


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ControlService]:
    service = make_service(least_privilege(tmp_path))
    yield service
    service.close()


def job_uid(service: ControlService, team: str = "research") -> int:
    """The uid the default config runs `team`'s jobs as here (after its first job)."""
    if os.geteuid() != 0:
        return os.getuid()
    table = Path(service.config.state_dir) / "team_uids.json"
    return int(json.loads(table.read_text())[team])


def run(service: ControlService, command: list[str], **spec: object) -> tuple[str, str]:
    """Run `command` as a job to its end; its state and its log."""
    out = service.submit({**job("probe", command=command, gpus=1), **spec})
    row = wait_state(service, out["id"], "succeeded", "failed")
    return row.state, b"".join(queries.job_logs(service, out["id"])).decode()


def test_a_job_sees_its_spec_env_and_gpu_variables_but_not_the_services_environment(
    svc: ControlService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPLANE_DB_PASSWORD", SECRET)
    monkeypatch.setenv("TZ", "UTC")
    state, log = run(svc, ["/usr/bin/env"], env={"MODEL": "llama"})
    assert state == "succeeded", log
    env = dict(line.split("=", 1) for line in log.splitlines())
    assert SECRET not in log
    assert env["MODEL"] == "llama"
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert env["PATH"] == MINIMAL_PATH
    assert env["TZ"] == "UTC"
    assert env["HOME"] != os.environ.get("HOME")
    allowed = {"MODEL", "CUDA_VISIBLE_DEVICES", "PATH", "HOME", "TZ", "LANG", "PWD"}
    assert set(env) - allowed <= {"GPUPLANE_JOB_ID", "GPUPLANE_JOB_NAME"}


def test_a_jobs_working_dir_is_its_own_and_removed_when_it_ends(svc: ControlService) -> None:
    script = 'cd "$HOME" && pwd && stat -c "%a %u" . && touch scratch && echo wrote'
    state, log = run(svc, ["/bin/sh", "-c", script])
    assert state == "succeeded", log
    home, mode_owner, wrote = log.split("\n")[:3]
    assert mode_owner == f"700 {job_uid(svc)}"
    assert wrote == "wrote"
    assert not Path(home).exists()  # released with the job


@AS_ROOT
def test_a_job_runs_as_its_teams_uid_and_cannot_read_or_change_the_state_dir(
    svc: ControlService, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    db = state_dir / "control.db"
    script = (
        f"id -u; cat {db} >/dev/null || echo read-refused; "
        f"echo 'UPDATE quotas SET gpus=100;' >> {db} || echo write-refused; "
        f"ls {state_dir}/clusters || echo list-refused"
    )
    state, log = run(svc, ["/bin/sh", "-c", script])
    assert state == "succeeded", log
    lines = log.splitlines()
    assert lines[0] == str(job_uid(svc)) != "0"
    assert UIDS.start <= int(lines[0]) < UIDS.start + UIDS.count
    assert "read-refused" in lines
    assert "write-refused" in lines
    assert "list-refused" in lines
    assert log.count("Permission denied") == 3, log
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    logs = list(state_dir.rglob("*.log"))
    assert logs
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)


def test_a_state_dir_found_looser_is_tightened_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir = tmp_path / "state"
    (state_dir / "clusters").mkdir(parents=True)
    state_dir.chmod(0o755)
    db = state_dir / "control.db"
    db.touch(mode=0o644)
    db.chmod(0o644)
    with caplog.at_level(logging.WARNING, "gpuplane.control"):
        service = make_service(least_privilege(tmp_path, allow_root_jobs=True))
    service.close()
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir / "clusters").stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert str(db) in warned
    assert f"{state_dir} was mode 755" in warned


@AS_ROOT
def test_a_root_service_refuses_to_run_jobs_as_root_saying_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="allow_root_jobs: true") as refused:
        make_service(least_privilege(tmp_path, job_user="root"))
    assert "cluster local" in str(refused.value)
    assert "is root (uid 0)" in str(refused.value)


def test_a_missing_job_user_is_refused_with_what_to_do() -> None:
    with pytest.raises(AdapterError) as refused:
        job_user("gpuplane-no-such-user", allow_root_jobs=False, uids=UIDS, euid=0)
    message = str(refused.value)
    assert "'gpuplane-no-such-user' does not exist" in message
    assert "unset control.job_user" in message


def test_job_user_needs_a_root_service_and_root_jobs_need_the_switch() -> None:
    with pytest.raises(AdapterError, match="does not run as root"):
        job_user("nobody", allow_root_jobs=False, uids=UIDS, euid=1000)
    # the service's own user
    assert job_user(None, allow_root_jobs=False, uids=UIDS, euid=1000) is None
    assert job_user(None, allow_root_jobs=True, uids=UIDS, euid=0) is None  # root, as asked
    assert job_user(None, allow_root_jobs=False, uids=UIDS, euid=0) == UIDS  # each team its own
    nobody = job_user("nobody", allow_root_jobs=False, uids=UIDS, euid=0)
    assert not isinstance(nobody, TeamUids)
    assert nobody is not None
    assert nobody.uid == pwd.getpwnam("nobody").pw_uid != 0


def test_a_uid_range_holding_a_user_of_this_machine_is_refused() -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    with pytest.raises(AdapterError, match=r"cover the uid of user.*nobody"):
        job_user(None, allow_root_jobs=False, uids=TeamUids(nobody - 1, 10), euid=0)


@AS_ROOT
def test_a_python_the_job_user_cannot_run_is_named_at_start_and_in_the_jobs_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    (hidden / "python").symlink_to("/bin/true")  # a Python under a root-only dir, like /root
    tmp_path.chmod(0o755)
    user = UIDS.probe()
    assert not can_run(user, str(hidden / "python"))
    assert can_run(user, "/bin/sh")
    monkeypatch.setattr("sys.executable", str(hidden / "python"))
    with caplog.at_level(logging.WARNING, logger="gpuplane.control"):
        service = make_service(least_privilege(tmp_path))
    monkeypatch.undo()  # the wrappers the service starts run the real interpreter
    try:
        warned = [
            r.getMessage() for r in caplog.records if "cannot run this service's" in r.message
        ]
        assert warned, caplog.text
        assert "their teams' own uids" in warned[0]
        assert "control.allow_root_jobs" in warned[0]
        out = service.submit(job("probe", command=[str(hidden / "python")], gpus=1))
        row = wait_state(service, out["id"], "succeeded", "failed")
        assert row.state == "failed"
        uid = job_uid(service)
        assert f"as user uid {uid}: Permission denied" in (row.message or "")
    finally:
        service.close()


@AS_ROOT
def test_a_stored_deployment_its_job_user_cannot_start_says_why_once_and_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment left in the store (by a killed `gpuplane up`, which ran its engines as
    root) meets a control plane whose jobs run as an unprivileged user who cannot run this
    Python: no instance starts to crash, its events say why once however many ticks pass, and
    a new apply is refused with the same reason."""
    hidden = tmp_path / "root-only"
    hidden.mkdir(mode=0o700)
    (hidden / "python").symlink_to("/bin/true")
    tmp_path.chmod(0o755)
    cfg = least_privilege(tmp_path)
    first = make_service(cfg.model_copy(update={"allow_root_jobs": True}))
    spec = {"name": "chat", "model": "sim", "engine": "sim", "team": "research", "replicas": 0}
    first.deployments.apply(spec)  # stored; no instance wanted yet
    with first.store.session() as session, session.begin():
        row = session.get(Deployment, "chat")
        assert row is not None
        row.spec = {**row.spec, "replicas": 1}  # as `up` left it
    first.close()
    monkeypatch.setattr("sys.executable", str(hidden / "python"))
    service = make_service(cfg)
    try:
        for _ in range(3):
            service.tick()
        described = describe(service, "chat")
        assert described["instances"] == []
        waiting = [e["message"] for e in described["events"] if "waiting" in e["message"]]
        assert len(waiting) == 1, described["events"]
        assert "cannot run this service's Python" in waiting[0]
        assert "control.job_user" in waiting[0]
        with pytest.raises(SpecError, match="cannot run this service's Python"):
            service.deployments.apply({**spec, "name": "other", "replicas": 1})
    finally:
        service.close()
