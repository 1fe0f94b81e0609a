"""Least privilege for the local adapter's jobs: which user they run as, and what they see.

A service running as root starts each job's command as its team's own uid and gid, from the
range `control.team_uid_start` / `team_uid_count` (`TeamUids`; which team holds which uid is
kept by `_team_ids.py`), or as the one user `control.job_user` when set; its wrapper stays root,
so it can still write the job's exit file into the state dir, which the job cannot read (mode
0700). Jobs run as root only with `control.allow_root_jobs: true` and no `job_user`. A service
that is not root cannot switch users: its jobs run as its own user, and naming a `job_user` is
refused. Whenever every team's jobs run as one user, `shared_user_note` says so at start.

A job's environment is built from nothing (`job_env`), never from the service's: its spec's
`env`, the adapter's GPU variables, a minimal PATH, HOME (its own directory, mode 0700, owned by
its user) and LANG/TZ when the service has them. The minimal PATH is the directory of the
service's Python, then /usr/local/bin:/usr/bin:/bin.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuplane.control.adapters.base import AdapterError

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# the service's own Python first, so `python` in a spec (the minimal job) is the interpreter the
# service runs; then the system's directories, nothing from the service's PATH
MINIMAL_PATH = f"{Path(sys.executable).parent}:{SYSTEM_PATH}"
PASSED_THROUGH = ("LANG", "TZ")  # locale and time zone: harmless, and output depends on them


@dataclass(frozen=True, slots=True)
class JobUser:
    """The unprivileged user a root service runs jobs as (uid, primary gid, its groups)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def wrapper_arg(self) -> str:
        """`uid:gid:g1,g2`: how the wrapper (`_wrap.py`) is told whom to run the command as."""
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


@dataclass(frozen=True, slots=True)
class TeamUids:
    """A root service's jobs run as their team's own uid (and gid) from this range: one team's
    job can neither read another's /proc/PID/environ, nor signal it, nor enter its HOME."""

    start: int
    count: int

    def user(self, team: str, uid: int) -> JobUser:
        """The user `team`'s jobs run as (`uid` from its `TeamIdTable`), with no other group."""
        return JobUser(f"team {team}", uid, uid, ())

    def probe(self) -> JobUser:
        """Any one of the range: what every team's uid may reach (the bits for others)."""
        return self.user("*", self.start)


def job_user(
    configured: str | None,
    allow_root_jobs: bool,
    uids: TeamUids,
    euid: int | None = None,
) -> JobUser | TeamUids | None:
    """Whom jobs run as: each team its own uid (`uids`), one user for every team, or None (the
    service's own user). Raises AdapterError saying what to set when a root service would run
    jobs as root without `allow_root_jobs`, or when the user or range cannot be used."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        if configured is not None:
            raise AdapterError(
                f"control.job_user is {configured!r} but the service does not run as root, so "
                "it cannot start jobs as another user; unset control.job_user (jobs then run "
                "as the service's user) or run the service as root"
            )
        return None
    if configured is None:
        return None if allow_root_jobs else _free_range(uids)
    try:
        entry = pwd.getpwnam(configured)
    except KeyError:
        raise AdapterError(
            f"control.job_user {configured!r} does not exist on this machine; create it "
            "(useradd --system --no-create-home gpuplane-job), or unset control.job_user to "
            "run each team's jobs as its own uid (control.team_uid_start)"
        ) from None
    if entry.pw_uid == 0 and not allow_root_jobs:
        raise AdapterError(
            f"control.job_user {entry.pw_name!r} is root (uid 0); name an unprivileged user, "
            "or set control.allow_root_jobs: true to run jobs as root"
        )
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)


def _free_range(uids: TeamUids) -> TeamUids:
    """`uids`, once no user of this machine holds one of them (a job would run as that user)."""
    end = uids.start + uids.count
    taken = sorted(e.pw_name for e in pwd.getpwall() if uids.start <= e.pw_uid < end)
    if taken:
        raise AdapterError(
            f"control.team_uid_start {uids.start} and team_uid_count {uids.count} cover the "
            f"uid of user(s) {', '.join(taken)} of this machine, whom teams' jobs would run as; "
            "move the range past every user's uid"
        )
    return uids


def shared_user_note(who: JobUser | TeamUids | None, euid: int | None = None) -> str | None:
    """Why every team's jobs run as one user, to say at start; None: each team has its own."""
    if isinstance(who, TeamUids):
        return None
    euid = os.geteuid() if euid is None else euid
    if who is not None:
        why = f"control.job_user is {who.name!r}"
    elif euid == 0:
        why = "control.allow_root_jobs is set, so jobs run as root"
    else:
        why = "the service does not run as root, so it cannot switch users"
    return (
        f"{why}: every team's jobs run as one user, and the local adapter gives no isolation "
        "between teams (a job can read another's environment, signal it and enter its files)"
    )


def can_run(user: JobUser, program: str) -> bool:
    """Whether `user` may execute `program`: search permission on every directory on the way
    to it and, symlinks resolved, to the file it names, and execute permission on that file, by
    the owner/group/other bits that apply to that user. A job as `nobody` cannot run a Python
    installed under /root, say (a venv's `python` is a symlink to it)."""
    given = Path(os.path.abspath(program))
    target = Path(os.path.realpath(program))
    dirs = {*given.parents, *target.parents}
    try:
        return all(_allows(user, d, stat.S_IXUSR) for d in dirs) and _allows(
            user, target, stat.S_IXUSR
        )
    except OSError:
        return False


def _allows(user: JobUser, path: Path, owner_bit: int) -> bool:
    """The permission bit (given as the owner's) that applies to `user` on `path`."""
    st = path.stat()
    if st.st_uid == user.uid:
        return bool(st.st_mode & owner_bit)
    if st.st_gid == user.gid or st.st_gid in user.groups:
        return bool(st.st_mode & (owner_bit >> 3))
    return bool(st.st_mode & (owner_bit >> 6))


def job_env(
    spec_env: Mapping[str, str],
    gpu_env: Mapping[str, str],
    home: str,
    service_env: Mapping[str, str],
) -> dict[str, str]:
    """A job's whole environment; nothing else of the service's (`service_env`) reaches it."""
    passed = {k: service_env[k] for k in PASSED_THROUGH if k in service_env}
    return {"PATH": MINIMAL_PATH, **passed, "HOME": home, **spec_env, **gpu_env}


def make_home(job_id: str, user: JobUser | None) -> str:
    """A fresh directory of the job's own (mode 0700, owned by its user), outside the state dir
    (which its user cannot enter). Removed by `remove_home` when the job is released."""
    try:
        home = tempfile.mkdtemp(prefix=f"gpuplane-job-{job_id}-")  # 0700, unguessable name
        if user is not None:
            os.chown(home, user.uid, user.gid)
    except OSError as exc:
        raise AdapterError(
            f"job {job_id}: cannot create its home directory under {tempfile.gettempdir()}: "
            f"{exc.strerror}; make it writable (or set TMPDIR for the service)"
        ) from None
    return home


def remove_home(home: str | None) -> None:
    """Idempotent; never raises."""
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
