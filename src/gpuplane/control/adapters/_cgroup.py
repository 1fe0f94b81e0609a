"""A cgroup v2 of its own for each local job: every process it starts is found and killed, and
its memory and CPU are enforced.

`probe` runs once, at the adapter's start: it finds the cgroup2 mount (`/proc/self/mounts`; on
a hybrid host it is /sys/fs/cgroup/unified, next to the v1 controllers), makes the parent
(`control.cgroup_parent`, default `gpuplane-jobs` under the service's own cgroup) and enables
the `memory` and `cpu` controllers down to it where the hierarchy has them. It answers a
`Containment`: the parent, the limits it can enforce, and what to say at start; None where no
cgroup can be made (a container without a delegated hierarchy, a service that is not root),
with the reason. `make` creates a job's cgroup and writes `memory.max` and `cpu.max`; the
wrapper joins it before it starts the job, so every descendant is born inside, `setsid` or not.
`kill` writes `cgroup.kill` (Linux 5.14) and waits until it is empty; `remove` then deletes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gpuplane.control.adapters.base import AdapterError

LIMITS = ("memory", "cpu")
CPU_PERIOD_US = 100_000
DEFAULT_PARENT = "gpuplane-jobs"
KILL_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class Containment:
    """Where jobs' cgroups go, and which of `LIMITS` they enforce (the rest: `note` says why)."""

    parent: Path
    limits: frozenset[str]
    note: str | None


def cgroup2_mount(mounts: str) -> str | None:
    """The mount point of the cgroup2 hierarchy in `/proc/self/mounts` text, if any."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return fields[1]
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path from `/proc/self/cgroup` text (the `0::` line)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def limit_files(memory_mib: int, cpu_millis: int, limits: frozenset[str]) -> dict[str, str]:
    """The interface files a job's cgroup gets: 0 requested means no limit."""
    files = {}
    if "memory" in limits and memory_mib > 0:
        files["memory.max"] = str(memory_mib * 1024 * 1024)
    if "cpu" in limits and cpu_millis > 0:
        files["cpu.max"] = f"{cpu_millis * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}"
    return files


def probe(configured: str | None) -> Containment | str:
    """Where this service can put its jobs' cgroups, or why it cannot (a sentence)."""
    try:
        mount = cgroup2_mount(Path("/proc/self/mounts").read_text())
        own = own_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return f"cannot read /proc/self/mounts or /proc/self/cgroup ({exc.strerror})"
    if mount is None:
        return "this machine has no cgroup v2 hierarchy mounted (cgroup2 in /proc/self/mounts)"
    if configured is not None:
        parent, top = Path(configured), Path(configured)
    elif own is None:
        return f"this process has no cgroup v2 path in /proc/self/cgroup ({mount} mounted)"
    else:
        top = Path(mount + own.rstrip("/"))
        parent = top / DEFAULT_PARENT
    try:
        parent.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot create {parent}: {exc.strerror} (the hierarchy is not delegated to it)"
    if not (parent / "cgroup.kill").exists():
        return f"{parent} has no cgroup.kill (Linux 5.14 or later, cgroup v2)"
    limits, note = _enable(top, parent)
    return Containment(parent, limits, note)


def _enable(top: Path, parent: Path) -> tuple[frozenset[str], str | None]:
    """Enable `LIMITS` in each subtree_control from `top` down to `parent`, as far as the
    hierarchy has them; the ones enabled, and why any is not."""
    rel = parent.relative_to(top).parts
    for d in [top, *(top.joinpath(*rel[: i + 1]) for i in range(len(rel)))]:
        have = _words(d / "cgroup.controllers")
        for name in set(LIMITS) & have - _words(d / "cgroup.subtree_control"):
            with contextlib.suppress(OSError):  # EBUSY: processes in a non-root cgroup
                (d / "cgroup.subtree_control").write_text(f"+{name}")
    limits = frozenset(set(LIMITS) & _words(parent / "cgroup.subtree_control"))
    missing = [n for n in LIMITS if n not in limits]
    if not missing:
        return limits, None
    return limits, (
        f"{', '.join(missing)} limits are not enforced: {parent} cannot enable the "
        f"{', '.join(missing)} controller (absent from {top}'s cgroup.controllers, e.g. bound "
        "to cgroup v1 on a hybrid host, or refused because the service's own cgroup holds "
        "processes); give the service a delegated cgroup (systemd: Delegate=yes) with them "
        "and set control.cgroup_parent to a cgroup under it"
    )


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def make(parent: Path, name: str, files: dict[str, str]) -> str:
    """The cgroup `parent/name` for one job, new, with `files` written; one left by an earlier
    try of the same job (a service killed between making it and recording the job) is
    emptied and replaced. Raises AdapterError."""
    path = parent / name
    if path.exists():
        kill(str(path))
        remove(str(path))
    try:
        path.mkdir()
    except OSError as exc:
        raise AdapterError(f"cannot create the cgroup {path}: {exc.strerror}") from None
    for key, value in files.items():
        try:
            (path / key).write_text(value)
        except OSError as exc:
            remove(str(path))
            raise AdapterError(
                f"cannot set {key} to {value} in {path}: {exc.strerror}; check the spec's "
                "memory and cpu"
            ) from None
    return str(path)


def members(path: str) -> list[int]:
    """The processes in cgroup `path` ([] once it is empty or gone)."""
    try:
        return [int(p) for p in Path(path, "cgroup.procs").read_text().split()]
    except OSError:
        return []


def signal_all(path: str, sig: signal.Signals) -> None:
    """Send `sig` to every process in the cgroup. Never raises."""
    for pid in members(path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill(path: str, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL every process in the cgroup at once (a fork cannot escape), then wait up to
    `wait_s` until it is empty (a process in uninterruptible sleep dies when it wakes); whether
    it is. Idempotent; never raises."""
    with contextlib.suppress(OSError):
        Path(path, "cgroup.kill").write_text("1")
    deadline = time.monotonic() + wait_s
    while members(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def remove(path: str) -> None:
    """Delete the (empty) cgroup. Idempotent; never raises."""
    with contextlib.suppress(OSError):
        os.rmdir(path)
