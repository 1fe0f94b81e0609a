"""The control plane's state dir (SQLite file, run records, job logs) is its owner's only.

Directories are mode 0700 and files 0600: a job, which runs as another user (`job_user`), can
neither read the store nor raise its team's quota through it, nor touch another job's records.
`secure_state_dir` runs at service start: it creates the dir so, tightens whatever it finds
looser (with a warning naming each path: something widened it) and creates an absent SQLite
file 0600 before SQLite opens it (its -wal and -shm files take the database file's mode).
`private_dir` creates the dirs the service adds later, `private_file` its key and token files.

`exclusive` is the one-owner rule: `gpuplane up` and `control serve` hold an exclusive lock on
the state dir's `lock` file for as long as they run, taken before anything in the dir is read
or changed. A second start in the same dir is refused, naming the process that holds it,
instead of taking back (and, on its way out, stopping) the first one's jobs. The kernel drops
the lock when its process ends, however it ends: a lock left by a killed process blocks nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shlex
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from gpuplane.errors import ConfigError

DIR_MODE = 0o700
FILE_MODE = 0o600
LOCK_FILE = "lock"

log = logging.getLogger("gpuplane.control")


def private_dir(path: Path) -> None:
    """Create `path` and each missing parent with mode 0700 (`mkdir -p` leaves parents 0755)."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        p.mkdir(mode=DIR_MODE, exist_ok=True)


def secure_state_dir(state_dir: str, database_url: str) -> None:
    """Make the state dir (and the SQLite file, when the store is one) the owner's only."""
    root = Path(state_dir)
    private_dir(root)
    for base, dirs, files in os.walk(root):
        _tighten(Path(base), DIR_MODE)
        for name in files:
            _tighten(Path(base, name), FILE_MODE)
        dirs[:] = [d for d in dirs if not Path(base, d).is_symlink()]
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        db = Path(str(url.database))
        private_dir(db.parent)
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, FILE_MODE))  # an empty file is a database
        _tighten(db, FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) & ~mode == 0:
        return
    log.warning(
        "%s was mode %o, open to users other than its owner (jobs among them): set to %o",
        path,
        stat.S_IMODE(st.st_mode),
        mode,
    )
    os.chmod(path, stat.S_IMODE(st.st_mode) & mode)


def private_file(path: Path, make: Callable[[], bytes]) -> bytes:
    """The bytes of `path`, a file of the owner's only; created 0600 with `make()` when absent
    (exclusively: of two processes starting at once, both read the one that won)."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        _tighten(path, FILE_MODE)
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        data = make()
        f.write(data)
    return data


class StateDirInUse(ConfigError):
    """Another process holds the state dir (`exclusive`)."""


@contextlib.contextmanager
def exclusive(state_dir: str) -> Iterator[None]:
    """Hold the state dir for this process while the block runs, or raise `StateDirInUse`
    naming the holder (its pid and command, which it wrote into the lock file) without waiting
    and without touching anything else in the dir. Released when the block ends, and by the
    kernel when the process dies (`flock`: a stale lock file does not block)."""
    root = Path(state_dir)
    try:
        private_dir(root)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)  # jobs do not inherit it
    except OSError as exc:
        raise ConfigError(
            f"cannot lock the state dir {root}: {exc.strerror}; make it writable, or set "
            "control.state_dir to a directory that is"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            raise StateDirInUse(
                f"the state dir {root.resolve()} is in use by another gpuplane process "
                f"({holder or 'starting'}); stop it first, or give this one another "
                "control.state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {shlex.join(sys.argv)}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # the holder's name leaves with it
    finally:
        os.close(fd)  # releases the lock
