"""The local adapter's job wrapper: runs one job and records how it ended, outliving the service.

Run as a script with only the standard library (`python -I -S _wrap.py ...`, so it starts in a
few milliseconds without importing gpuplane):

    _wrap.py GO_FD REPORT_FD RECORD EXIT USER -- COMMAND...

The adapter starts it as a session leader, writes RECORD (this process's pid and start time),
then writes one byte to GO_FD. End of file there instead means the service died before it
recorded this process: RECORD is removed and nothing runs, so a job never runs unrecorded. The
wrapper then starts COMMAND in its process group (as USER, `uid:gid:groups`, when it is not
"-": setgroups, setgid and setuid before exec; the wrapper keeps its own user, so the exit file
lands where only the service can read it), writes "ok" or "error: <why>" to REPORT_FD,
waits for it and writes its exit code (negative: killed by that signal) to EXIT, temp file and
rename, so an exit while the service is down is read by the next one. SIGTERM and SIGINT do not
stop the wrapper (the adapter signals the whole group: the command decides, and its exit is
still recorded); the command gets the default handlers back.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
from types import FrameType


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


def main(argv: list[str]) -> int:
    go_fd, report_fd = int(argv[1]), int(argv[2])
    record, exit_path, user = argv[3], argv[4], argv[5]
    command = argv[argv.index("--") + 1 :]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore)
    go = os.read(go_fd, 1)
    os.close(go_fd)
    if not go:  # the service died before it recorded this process: run nothing
        with contextlib.suppress(FileNotFoundError):
            os.unlink(record)
        return 0
    try:
        uid, gid, groups = _as_user(user)
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, user=uid, group=gid, extra_groups=groups
        )
    except OSError as exc:
        who = "" if uid is None else f" as user {_name_of(uid)}"
        why = f"cannot start {command[0]!r}{who}: {exc.strerror or exc}"
        write_atomic(exit_path, json.dumps({"code": 127, "error": why}))
        print(f"gpuplane: {why}", file=sys.stderr, flush=True)
        _report(report_fd, f"error: {why}")
        return 127
    _report(report_fd, "ok")
    code = proc.wait()
    write_atomic(exit_path, json.dumps({"code": code}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
