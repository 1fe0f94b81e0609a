"""The tenant boundary on the local adapter (issue 35): nothing in a job's spec runs as root, one
team's job can neither read, signal nor enter another team's, and no process of a job outlives
its cancel.

Hostile specs, as a member would write them. The commands are `/bin/sh` and coreutils, which
any uid can run (the test interpreter lives under /root).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.adapters import AdapterError, _cgroup
from gpuplane.control.adapters._privilege import TeamUids
from gpuplane.control.adapters._team_ids import TeamIdTable, assign
from gpuplane.control.adapters._wrap import WRAPPER_ENV
from gpuplane.control.adapters.local import LocalAdapter
from gpuplane.control.adapters.procs import process_start
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig, TeamConfig
from gpuplane.control.store import queries
from tests.control.svc_helpers import job, least_privilege, make_service, wait_state

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs the service as root")
TEAMS = (TeamConfig(name="research"), TeamConfig(name="prod"))
CGROUPS = _cgroup.probe(None)
NEEDS_CGROUP = pytest.mark.skipif(
    not isinstance(CGROUPS, _cgroup.Containment), reason=f"no job cgroups here: {CGROUPS}"
)


def settings(tmp_path: Path, **update: object) -> ControlConfig:
    """Two teams; this feature's defaults (no root jobs, no shared user) unless `update`."""
    return least_privilege(tmp_path, TEAMS, **{"allow_shared_job_user": False, **update})


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ControlService]:
    service = make_service(settings(tmp_path))
    yield service
    service.close()


def log_of(service: ControlService, job_id: str) -> str:
    return b"".join(queries.job_logs(service, job_id)).decode()


def wait_log(service: ControlService, job_id: str, lines: int) -> list[str]:
    """The job's first `lines` log lines, once it wrote them (2 min at most)."""
    for _ in range(2400):
        service.tick()
        got = log_of(service, job_id).splitlines()
        if len(got) >= lines:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{job_id} wrote {log_of(service, job_id)!r}")


def adapter(service: ControlService) -> LocalAdapter:
    local = service.adapters["local"]
    assert isinstance(local, LocalAdapter)
    return local


# -- 1: the job's env reaches only the job's process ------------------------------------------


@AS_ROOT
@pytest.mark.skipif(shutil.which("cc") is None, reason="builds a preload library with cc")
def test_an_ld_preload_in_the_spec_never_runs_as_root(svc: ControlService, tmp_path: Path) -> None:
    marker = tmp_path / "ran-as-root"
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <fcntl.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void evil(void) {\n"
        f'  if (geteuid() == 0) close(open("{marker}", O_CREAT | O_WRONLY, 0644));\n'
        "}\n"
    )
    lib = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    hostile = {"LD_PRELOAD": str(lib), "LD_AUDIT": str(lib), "PYTHONSTARTUP": str(source)}
    out = svc.submit({**job("evil", command=["/bin/sh", "-c", "id -u"]), "env": hostile})
    row = wait_state(svc, out["id"], "succeeded", "failed")
    assert row.state == "succeeded", log_of(svc, out["id"])
    assert not marker.exists()  # neither the wrapper (root) nor the job (its team's uid) ran it
    assert log_of(svc, out["id"]).splitlines()[-1] != "0"


def test_the_wrapper_runs_in_the_services_fixed_environment(svc: ControlService) -> None:
    env = {"LD_LIBRARY_PATH": "/tmp/evil", "PYTHONPATH": "/tmp/evil", "MODEL": "llama"}
    out = svc.submit({**job("env", command=["/bin/sh", "-c", "env; sleep 300"]), "env": env})
    seen = dict(line.split("=", 1) for line in wait_log(svc, out["id"], 3) if "=" in line)
    assert seen["LD_LIBRARY_PATH"] == seen["PYTHONPATH"] == "/tmp/evil"  # the job gets its env
    wrapper = adapter(svc)._held()[out["id"]].record.pid
    raw = Path(f"/proc/{wrapper}/environ").read_bytes()
    assert dict(e.decode().split("=", 1) for e in raw.split(b"\0") if e) == WRAPPER_ENV
    svc.cancel(out["id"])


# -- 2: each team its own uid -----------------------------------------------------------------


@AS_ROOT
def test_a_team_can_neither_read_signal_nor_enter_another_teams_job(svc: ControlService) -> None:
    victim_script = 'echo "$$"; echo "$HOME"; exec sleep 300'
    victim = svc.submit(
        {**job("victim", team="prod", command=["/bin/sh", "-c", victim_script]), "env": {"K": "x"}}
    )["id"]
    pid, home = wait_log(svc, victim, 2)[:2]
    attack = (
        f"id -u; cat /proc/{pid}/environ >/dev/null 2>&1 || echo environ-refused; "
        f"kill -9 {pid} 2>/dev/null || echo kill-refused; "
        f"ls {home} >/dev/null 2>&1 || echo home-refused"
    )
    attacker = svc.submit(job("attacker", team="research", command=["/bin/sh", "-c", attack]))
    row = wait_state(svc, attacker["id"], "succeeded", "failed")
    lines = log_of(svc, attacker["id"]).splitlines()
    assert row.state == "succeeded", lines
    assert lines[1:] == ["environ-refused", "kill-refused", "home-refused"]
    assert wait_state(svc, victim, "running").state == "running"  # not killed
    assert process_start(int(pid)) is not None
    victim_uid = Path(f"/proc/{pid}").stat().st_uid
    assert 0 not in {victim_uid, int(lines[0])}
    assert victim_uid != int(lines[0])
    assert Path(home).stat().st_uid == victim_uid
    svc.cancel(victim)


def test_teams_sharing_one_user_are_refused_side_by_side_saying_what_to_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "gpuplane.control"):
        service = make_service(settings(tmp_path, allow_root_jobs=True))  # not root: its own
    try:
        assert "no isolation between teams" in caplog.text
        running = service.submit(job("first", team="prod"))["id"]
        assert wait_state(service, running, "running").state == "running"
        second = service.submit(job("second", team="research", command=["/bin/true"]))["id"]
        row = wait_state(service, second, "failed", "succeeded")
        assert row.state == "failed"
        assert "runs team prod's now" in (row.message or "")
        assert "control.allow_shared_job_user: true" in (row.message or "")
        same = service.submit(job("same", team="prod", command=["/bin/true"]))["id"]
        assert wait_state(service, same, "failed", "succeeded").state == "succeeded"
        service.cancel(running)
        after = service.submit(job("after", team="research", command=["/bin/true"]))["id"]
        assert wait_state(service, after, "failed", "succeeded").state == "succeeded"
    finally:
        service.close()


def test_the_operator_may_let_teams_share_one_user(tmp_path: Path) -> None:
    cfg = settings(tmp_path, allow_root_jobs=True, allow_shared_job_user=True)
    service = make_service(cfg)
    try:
        running = service.submit(job("first", team="prod"))["id"]
        assert wait_state(service, running, "running").state == "running"
        second = service.submit(job("second", team="research", command=["/bin/true"]))["id"]
        assert wait_state(service, second, "failed", "succeeded").state == "succeeded"
        service.cancel(running)
    finally:
        service.close()


# -- 4: no process of a job outlives it -------------------------------------------------------

ESCAPE = ["/bin/sh", "-c", "setsid sleep 300 & echo $!; wait"]  # a grandchild in its own session


def assert_escapee_stopped(service: ControlService, end: str) -> str | None:
    """A job whose grandchild left its session: `end` (cancel, or its time limit) kills it.
    Returns the job's cgroup (None: none)."""
    spec = job("escape", command=ESCAPE)
    if end == "limit":
        spec["time_limit"] = "2s"
    job_id = service.submit(spec)["id"]
    pid = int(wait_log(service, job_id, 1)[0])
    cgroup = adapter(service)._held()[job_id].record.cgroup
    assert process_start(pid) is not None
    try:
        if end == "cancel":
            service.cancel(job_id)
        else:
            row = wait_state(service, job_id, "failed", "succeeded")
            assert "time limit" in (row.message or ""), row.message
        assert adapter(service).workloads() == []
        assert process_start(pid) is None, "the setsid grandchild outlived its job"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # what old code left behind
    return cgroup


@NEEDS_CGROUP
@pytest.mark.parametrize("end", ["cancel", "limit"])
def test_a_setsid_grandchild_dies_with_its_job_in_its_cgroup(tmp_path: Path, end: str) -> None:
    service = make_service(settings(tmp_path, allow_shared_job_user=True, allow_root_jobs=True))
    try:
        cgroup = assert_escapee_stopped(service, end)
        assert cgroup is not None
        assert not Path(cgroup).exists()  # removed with the job
    finally:
        service.close()


@pytest.mark.parametrize("end", ["cancel", "limit"])
def test_a_setsid_grandchild_dies_with_its_job_under_the_subreaper(
    tmp_path: Path, end: str
) -> None:
    cfg = settings(
        tmp_path, allow_shared_job_user=True, allow_root_jobs=True, job_containment="subreaper"
    )
    service = make_service(cfg)
    try:
        assert assert_escapee_stopped(service, end) is None
    finally:
        service.close()


@NEEDS_CGROUP
def test_a_jobs_cgroup_holds_its_memory_and_cpu_limits(tmp_path: Path) -> None:
    assert isinstance(CGROUPS, _cgroup.Containment)
    if CGROUPS.limits != frozenset(_cgroup.LIMITS):
        pytest.skip(f"this machine's cgroup v2 cannot enforce them: {CGROUPS.note}")
    service = make_service(settings(tmp_path, allow_shared_job_user=True, allow_root_jobs=True))
    try:
        out = service.submit(job("limited", cpu_millis=500, memory_mib=256))
        assert wait_state(service, out["id"], "running").state == "running"
        cgroup = adapter(service)._held()[out["id"]].record.cgroup
        assert cgroup is not None
        assert Path(cgroup, "memory.max").read_text().strip() == str(256 * 1024 * 1024)
        assert Path(cgroup, "cpu.max").read_text().split() == ["50000", "100000"]
        service.cancel(out["id"])
        assert not Path(cgroup).exists()
    finally:
        service.close()


@NEEDS_CGROUP
def test_a_job_asking_for_limits_this_machine_cannot_enforce_is_warned_of_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The machine's gap is only noted at start (a plane whose jobs ask no limits has nothing
    to fear); the first job that asks for one is a warning, naming it, and the next is not."""
    assert isinstance(CGROUPS, _cgroup.Containment)
    if CGROUPS.limits == frozenset(_cgroup.LIMITS):
        pytest.skip("this machine's cgroup v2 enforces every limit")
    cfg = settings(tmp_path, allow_shared_job_user=True, allow_root_jobs=True)
    with caplog.at_level(logging.WARNING, "gpuplane.control"):
        service = make_service(cfg)
        try:
            assert "not enforced" not in caplog.text  # at start: no warning
            for name in ("first", "second"):
                out = service.submit(job(name, memory_mib=256))
                assert wait_state(service, out["id"], "running").state == "running"
                service.cancel(out["id"])
        finally:
            service.close()
    said = [r.getMessage() for r in caplog.records if "does not enforce" in r.getMessage()]
    assert len(said) == 1, said
    assert "asks for limits this machine does not enforce" in said[0]


def test_limit_files_ask_for_what_the_spec_requests() -> None:
    both = frozenset(_cgroup.LIMITS)
    assert _cgroup.limit_files(256, 1500, both) == {
        "memory.max": str(256 << 20),
        "cpu.max": "150000 100000",
    }
    assert _cgroup.limit_files(0, 0, both) == {}  # nothing requested: no limit
    assert _cgroup.limit_files(256, 1500, frozenset()) == {}  # no controller: said at start


def test_the_cgroup_v2_mount_and_own_cgroup_are_read_from_proc() -> None:
    hybrid = (
        "cgroup /sys/fs/cgroup/memory cgroup rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0"
    )
    assert _cgroup.cgroup2_mount(hybrid) == "/sys/fs/cgroup/unified"
    assert _cgroup.cgroup2_mount("cgroup /sys/fs/cgroup/memory cgroup rw 0 0") is None
    assert (
        _cgroup.own_cgroup("4:memory:/x\n0::/system.slice/gp.service") == "/system.slice/gp.service"
    )


def test_cgroups_asked_for_where_none_can_be_made_refuse_the_start_naming_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = str(tmp_path / "no" / "such" / "cgroup")
    cfg = settings(tmp_path, allow_root_jobs=True, cgroup_parent=nowhere)
    with pytest.raises(AdapterError, match=r"control\.job_containment: subreaper"):
        make_service(cfg.model_copy(update={"job_containment": "cgroup"}))
    with caplog.at_level(logging.WARNING, "gpuplane.control"):
        service = make_service(cfg)  # auto: falls back, and says so
    service.close()
    assert "jobs get no cgroup of their own" in caplog.text
    assert "memory and CPU limits are not enforced" in caplog.text


def test_a_team_keeps_its_uid_and_a_full_range_is_refused_naming_the_setting(
    tmp_path: Path,
) -> None:
    uids = TeamUids(5000, 2)
    table = TeamIdTable(tmp_path, uids)
    assert [table.uid("prod"), table.uid("research"), table.uid("prod")] == [5000, 5001, 5000]
    assert TeamIdTable(tmp_path, uids).uid("research") == 5001  # kept, for the next service
    with pytest.raises(AdapterError, match="raise team_uid_count"):
        table.uid("third")
    assert assign({"a": 5001}, "b", uids) == 5000  # the lowest free one


def test_an_unreadable_uid_table_is_refused_not_reassigned(tmp_path: Path) -> None:
    (tmp_path / "team_uids.json").write_text("{not json")
    with pytest.raises(AdapterError, match="restore it from a backup"):
        TeamIdTable(tmp_path, TeamUids(5000, 2)).uid("prod")


@NEEDS_CGROUP
def test_a_cgroup_left_by_an_earlier_try_of_the_job_is_emptied_and_replaced(
    tmp_path: Path,
) -> None:
    assert isinstance(CGROUPS, _cgroup.Containment)
    name = f"stale-{os.getpid()}"
    first = _cgroup.make(CGROUPS.parent, name, {})
    left = subprocess.Popen(["sleep", "300"])  # what a killed service's try left in it
    try:
        Path(first, "cgroup.procs").write_text(str(left.pid))
        second = _cgroup.make(CGROUPS.parent, name, {})
        assert second == first
        assert left.wait() == -signal.SIGKILL
        assert _cgroup.members(second) == []
    finally:
        left.kill()
        left.wait()
        _cgroup.remove(first)
