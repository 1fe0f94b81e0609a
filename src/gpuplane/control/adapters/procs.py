"""The local adapter's job processes, which outlive the service: start, record, find again, stop.

A job runs under the wrapper (`_wrap.py`) in a session of its own, so a signal to the service
does not reach it. `RunDir.start` spawns the wrapper, records its pid and start time in
`<job>.json` (temp file and rename), and only then lets it start the job: a job never runs
unrecorded. The wrapper writes the job's exit code to `<job>.exit` when it ends, so an exit while
the service is down is kept. A process is known by its pid AND its start time (`process_start`),
never by the pid alone: pids are reused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from gpuplane.control.adapters import _cgroup
from gpuplane.control.adapters._privilege import JobUser
from gpuplane.control.adapters._wrap import (
    WRAPPER_ENV,
    descendants,
    kill_descendants,
    live_processes,
    write_atomic,
)
from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.statedir import private_dir

WRAPPER = str(Path(__file__).with_name("_wrap.py"))
FIX = "check the command (on PATH? executable?) and workdir in the job spec"
_PROC = os.path.exists("/proc/self/stat")  # Linux; elsewhere `ps` tells a process's start time

log = logging.getLogger("gpuplane.control")


def process_start(pid: int) -> str | None:
    """When process `pid` started, as a token that tells it from a later process given the same
    pid; None when no such process runs (a zombie has ended). From /proc/<pid>/stat field 22
    (clock ticks after boot); without /proc, from `ps -o lstart` (to the second)."""
    if _PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        # field 2 (the command, in parentheses) may hold spaces and ')': count after the last ')'
        fields = stat[stat.rindex(b")") + 2 :].split()
        return None if fields[0] in (b"Z", b"X") else f"ticks:{int(fields[19])}"
    try:
        out = subprocess.run(
            ["ps", "-o", "stat=,lstart=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split(maxsplit=1)
    except (OSError, subprocess.SubprocessError):
        return None
    return None if len(out) < 2 or out[0].startswith("Z") else f"ps:{out[1].strip()}"


def session_orphans(sid: int) -> list[int]:
    """The live processes of session `sid` once its leader has ended (is gone or a zombie).

    They can only be the leader's own descendants: Linux gives no new process an id that a
    session still uses, so no stranger's session can carry this id while one of them lives.
    While a live process holds the id (the leader, or a stranger that reused it after the whole
    session ended), there are none. Linux only (/proc); elsewhere always []."""
    if not _PROC or process_start(sid) is not None:
        return []
    return [pid for pid, fields in live_processes() if int(fields[3]) == sid]


class JobRecord(BaseModel):
    """One bound job as kept on disk: enough for a restarted service to know its process,
    measure its time limit and stop it."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    # the control-plane process that bound it (another one's are not ours); records written
    # before it was renamed say `instance`: read as this
    service_id: str | None = Field(validation_alias=AliasChoices("service_id", "instance"))
    pid: int  # the wrapper's: a session and process group leader
    start_time: str  # `process_start(pid)` at bind: pid and start time name one process
    started: float  # time.monotonic() at bind; that clock is the machine's, not the process's
    limit_s: float | None
    placement: dict[str, str]  # node and device env: bound again elsewhere, it starts afresh
    home: str | None = None  # its own directory (HOME), removed when it is released
    team: str | None = None  # whose job: jobs of teams sharing one user are refused together
    cgroup: str | None = None  # its own cgroup v2 (`_cgroup.py`): killed and removed at release
    reap: bool = False  # no cgroup: its wrapper is a subreaper, whose descendants are the job's


class ExitRecord(BaseModel):
    """What the wrapper writes when the job ends: its exit code, or why it could not start."""

    code: int
    error: str | None = None


@dataclass(slots=True)
class JobProcess:
    record: JobRecord
    popen: subprocess.Popen[bytes] | None = None  # started by this process: polled to reap it

    def alive(self) -> bool:
        """Does the recorded process still run (same pid, same start time, not a zombie)?"""
        if self.popen is not None:
            self.popen.poll()
        return process_start(self.record.pid) == self.record.start_time

    def kill(self) -> None:
        """SIGKILL every process of the job now, as a crash or a lost machine would (drills);
        the wrapper dies too, so `status` reports the job lost. Idempotent; never raises."""
        record = self.record
        if record.cgroup is not None:
            _cgroup.kill(record.cgroup)
            return
        if self.alive():
            if record.reap:  # before the wrapper: its orphans would leave its tree
                kill_descendants(record.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the job's processes, SIGKILL after `grace_s` to every one that is left,
        then its cgroup is removed. Without a cgroup, the identity of the wrapper is checked
        again before each signal, so a reused pid is never signalled, and a wrapper killed on
        its own (say, by the OOM killer) leaves its job running in its session: those processes
        are stopped the same way, so a card is never freed while its job still runs (a process
        that left the session with `setsid` is stopped only with a cgroup, or while its
        subreaper wrapper lives). Idempotent; never raises."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.kill()
        self._signal(signal.SIGKILL)  # what a dead wrapper left in its session
        deadline = time.monotonic() + _cgroup.KILL_WAIT_S
        while self._running():
            if time.monotonic() >= deadline:  # uninterruptible sleep: it dies when it wakes
                log.warning("job %s: processes still ending after SIGKILL", self.record.job_id)
                return
            time.sleep(0.02)
        if self.record.cgroup is not None:
            _cgroup.remove(self.record.cgroup)

    def _signal(self, sig: signal.Signals) -> None:
        record = self.record
        if record.cgroup is not None:
            _cgroup.signal_all(record.cgroup, sig)
        elif self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, sig)
            if record.reap:
                for member in descendants(record.pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(member, sig)
        else:
            for member in session_orphans(record.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(member, sig)

    def _running(self) -> bool:
        record = self.record
        if record.cgroup is not None:
            return bool(_cgroup.members(record.cgroup))
        return self.alive() or bool(session_orphans(record.pid))


class RunDir:
    """The records of one local cluster's jobs, in one directory."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()  # the wrapper runs in the job's workdir

    def files(self, job_id: str) -> tuple[str, str]:
        """The job's record and exit file."""
        base = str(self.path / job_id)
        return f"{base}.json", f"{base}.exit"

    def load(self, service_id: str | None) -> dict[str, JobProcess]:
        """The processes that service process `service_id` recorded and has not released."""
        out = {}
        for path in sorted(self.path.glob("*.json")):
            try:
                record = JobRecord.model_validate_json(path.read_bytes())
            except (OSError, ValidationError) as exc:
                log.warning("ignoring unreadable job record %s: %s", path, exc)
                continue
            if record.service_id == service_id:
                out[record.job_id] = JobProcess(record)
        return out

    def exit(self, job_id: str) -> ExitRecord | None:
        """How the job ended, once its wrapper wrote it."""
        try:
            with open(self.files(job_id)[1], "rb") as f:
                return ExitRecord.model_validate_json(f.read())
        except (OSError, ValidationError):
            return None

    def forget(self, job_id: str) -> None:
        """Remove the job's record and exit file. Idempotent."""
        for path in self.files(job_id):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def start(
        self,
        job_id: str,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: str | None,
        log_path: str,
        *,
        service_id: str | None,
        limit_s: float | None,
        placement: dict[str, str],
        user: JobUser | None,
        home: str | None,
        team: str | None = None,
        cgroup: str | None = None,
    ) -> JobProcess:
        """Spawn the wrapper (in `WRAPPER_ENV`), record it, then send it `env` and `cgroup` to
        start `command` with (as `user`, None: as this process; in `cgroup`, None: under the
        wrapper as a subreaper); returns once the command started. Raises AdapterError saying
        why it could not."""
        _check_env(job_id, env)
        record_path, exit_path = self.files(job_id)
        private_dir(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(exit_path)  # an earlier run's end is not this one's
        go_r, go_w = os.pipe()
        report_r, report_w = os.pipe()
        with open(go_w, "wb", buffering=0) as go, open(report_r, "rb") as report:
            argv = [sys.executable, "-I", "-S", WRAPPER, str(go_r), str(report_w)]
            argv += [record_path, exit_path, "-" if user is None else user.wrapper_arg()]
            argv += ["--", *command]
            try:
                popen = _spawn(job_id, argv, workdir, log_path, (go_r, report_w))
            finally:
                os.close(go_r)
                os.close(report_w)
            record = JobRecord(
                job_id=job_id,
                service_id=service_id,
                pid=popen.pid,
                start_time=process_start(popen.pid) or "",
                started=time.monotonic(),
                limit_s=limit_s,
                placement=placement,
                home=home,
                team=team,
                cgroup=cgroup,
                reap=cgroup is None,
            )
            try:
                write_atomic(record_path, record.model_dump_json())
            except OSError as exc:
                go.close()  # end of file: the wrapper runs nothing
                popen.wait()
                raise AdapterError(
                    f"job {job_id}: cannot record its process in {record_path}: {exc.strerror}; "
                    "make the control plane's state_dir writable"
                ) from None
            message = {"env": dict(env), "cgroup": cgroup, "reap": record.reap}
            with contextlib.suppress(BrokenPipeError):  # it ended: the answer below is empty
                go.write(json.dumps(message).encode())
            go.close()
            answer = report.read().decode(errors="replace")
        if answer != "ok":
            popen.wait()
            self.forget(job_id)
            why = answer.removeprefix("error: ") or "its wrapper ended before starting it"
            raise AdapterError(f"job {job_id}: {why}; {FIX}")
        return JobProcess(record, popen)


def _check_env(job_id: str, env: Mapping[str, str]) -> None:
    """Refuse what no process can be given (execve's rules), before anything starts."""
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise AdapterError(
                f"job {job_id}: its env cannot be passed to a process ({name!r}); remove NUL "
                "bytes, and '=' from env names, in the job spec"
            )


def _spawn(
    job_id: str,
    argv: list[str],
    workdir: str | None,
    log_path: str,
    fds: tuple[int, int],
) -> subprocess.Popen[bytes]:
    try:
        private_dir(Path(log_path).parent)
        # the service's only (0600): the job writes it through the descriptor it inherits
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        out = open(fd, "ab")  # noqa: SIM115 - closed below, once the wrapper holds it
    except OSError as exc:
        raise AdapterError(
            f"job {job_id}: cannot open its log {log_path}: {exc.strerror}; "
            "make the control plane's state_dir writable"
        ) from None
    with out:
        try:
            return subprocess.Popen(
                argv,
                env=WRAPPER_ENV,  # it runs as root: nothing of the job's may reach it
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # signals to the service do not reach the job
                pass_fds=fds,
            )
        except ValueError as exc:  # e.g. a NUL byte, or '=' in an env name
            raise AdapterError(
                f"job {job_id}: its command or workdir cannot be passed to a process "
                f"({exc}); remove NUL bytes from them in the job spec"
            ) from None
        except OSError as exc:
            if workdir is not None and exc.filename == workdir:
                raise AdapterError(
                    f"job {job_id}: cannot run in workdir {workdir!r}: {exc.strerror}; "
                    "create it or fix `workdir` in the job spec"
                ) from None
            raise AdapterError(
                f"job {job_id}: cannot start its wrapper ({sys.executable}): {exc.strerror}"
            ) from None
