"""The local adapter's job wrapper: runs one job and records how it ended, outliving the service.

Run as a script with only the standard library (`python -I -S _wrap.py ...`, so it starts in a
few milliseconds without importing gpuplane), in a fixed environment of the service's choosing
(`WRAPPER_ENV`): it runs as root, so nothing of the job's reaches it (no LD_PRELOAD, LD_AUDIT,
LD_LIBRARY_PATH; -I ignores every PYTHON* variable, the working dir and user site-packages):

    _wrap.py GO_FD REPORT_FD RECORD EXIT USER -- COMMAND...

The adapter starts it as a session leader, writes RECORD (this process's pid and start time),
then writes the start message to GO_FD and closes it: JSON `{"env": {...}, "cgroup": path or
null, "reap": bool}`. End of file with nothing instead means the service died before it recorded
this process: RECORD is removed and nothing runs, so a job never runs unrecorded. The wrapper
joins `cgroup` (so every process the job starts is born in it), or with `reap` becomes a child
subreaper (so the job's orphans, `setsid` or not, stay its descendants), then starts COMMAND in
its process group with `env` (as USER, `uid:gid:groups`, when it is not "-": setgroups, setgid
and setuid before exec, so the job's environment meets only the job's user; the wrapper keeps
its own, so the exit file lands where only the service can read it), writes "ok" or
"error: <why>" to REPORT_FD, waits for it and writes its exit code (negative: killed by that
signal) to EXIT, temp file and rename, so an exit while the service is down is read by the next
one. With `reap` it then kills what the job left running. SIGTERM and SIGINT do not stop the
wrapper (the adapter signals the whole group: the command decides, and its exit is still
recorded); the command gets the default handlers back.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

# the wrapper's whole environment (it runs as root): no variable of the job's or the service's
WRAPPER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def write_atomic(path: str, text: str) -> None:
    """Replace `path` with `text` in one step (temp file in the same directory, then rename);
    the file is the owner's only (0600)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A Python handler, not SIG_IGN: exec resets it, so the command keeps the default ones."""


def _report(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):  # the service may be gone: the exit file still counts
        os.write(fd, text.encode(errors="replace"))
    os.close(fd)


def _as_user(arg: str) -> tuple[int | None, int | None, list[int] | None]:
    """Popen's `user`, `group` and `extra_groups` from `uid:gid:g1,g2` ("-": this process's)."""
    if arg == "-":
        return None, None, None
    uid, gid, groups = arg.split(":")
    return int(uid), int(gid), [int(g) for g in groups.split(",") if g]  # []: root's dropped


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def live_processes() -> Iterator[tuple[int, list[bytes]]]:
    """Each live process (not a zombie) with the fields of its /proc/<pid>/stat after the
    command: [0] state, [1] parent pid, [3] session id. Nothing without /proc."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # field 2 (the command, in parentheses) may hold spaces and ')': after the last ')'
            fields = stat[stat.rindex(b")") + 2 :].split()
            if fields[0] not in (b"Z", b"X"):
                yield int(entry.name), fields


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` in the parent tree, from /proc ([] elsewhere)."""
    children: dict[int, list[int]] = {}
    for child, fields in live_processes():
        children.setdefault(int(fields[1]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants(pid: int, reap: bool = False) -> None:
    """SIGKILL every process below `pid` until none is left (one that forked meanwhile is
    found on the next pass); with `reap` (`pid` is this process, a subreaper), reaps the ones
    that became its children. Never raises."""
    while below := descendants(pid):
        for member in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, signal.SIGKILL)
        if reap:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
        time.sleep(0.01)


def _contain(start: dict[str, Any]) -> str | None:
    """Join the job's cgroup, or become a child subreaper, as the start message says; why not."""
    if start.get("cgroup"):
        try:
            with open(os.path.join(start["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            return f"cannot join its cgroup {start['cgroup']}: {exc.strerror}"
    if start.get("reap"):
        import ctypes  # only here: a few milliseconds the cgroup path does not pay

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"cannot become a subreaper: {os.strerror(ctypes.get_errno())}"
    return None


def _read_start(fd: int) -> dict[str, Any] | None:
    with open(fd, "rb") as f:
        data = f.read()
    return json.loads(data) if data else None


def _fail(exit_path: str, report_fd: int, why: str) -> int:
    write_atomic(exit_path, json.dumps({"code": 127, "error": why}))
    print(f"gpuplane: {why}", file=sys.stderr, flush=True)
    _report(report_fd, f"error: {why}")
    return 127


def main(argv: list[str]) -> int:
    go_fd, report_fd = int(argv[1]), int(argv[2])
    record, exit_path, user = argv[3], argv[4], argv[5]
    command = argv[argv.index("--") + 1 :]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore)
    start = _read_start(go_fd)
    if start is None:  # the service died before it recorded this process: run nothing
        with contextlib.suppress(FileNotFoundError):
            os.unlink(record)
        return 0
    uid, gid, groups = _as_user(user)
    why = _contain(start)
    if why is not None:
        return _fail(exit_path, report_fd, why)
    try:
        proc = subprocess.Popen(
            command,
            env=start["env"],
            stdin=subprocess.DEVNULL,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    except OSError as exc:
        who = "" if uid is None else f" as user {_name_of(uid)}"
        why = f"cannot start {command[0]!r}{who}: {exc.strerror or exc}"
        return _fail(exit_path, report_fd, why)
    _report(report_fd, "ok")
    code = proc.wait()
    write_atomic(exit_path, json.dumps({"code": code}))
    if start.get("reap"):
        kill_descendants(os.getpid(), reap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
