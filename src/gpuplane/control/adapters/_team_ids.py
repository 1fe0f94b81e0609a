"""Which uid each team's local jobs run as: assigned once from the configured range, kept.

A team keeps its uid for good (files its jobs left behind stay its own, never the next team's),
so the table lives in the state dir (`team_uids.json`, the service's only), shared by every
local cluster of the service; `assign` is the pure core, `TeamIdTable` the file around it,
locked (`flock`) for the read-assign-write so two services on one state dir agree.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from gpuplane.control.adapters._privilege import TeamUids
from gpuplane.control.adapters._wrap import write_atomic
from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.statedir import private_dir

_LOCK = threading.Lock()  # flock is per open file: threads of one process take this too


def assign(table: Mapping[str, int], team: str, uids: TeamUids) -> int:
    """`team`'s uid: the one it holds, else the lowest of the range no team holds. Raises
    AdapterError when every uid of the range is taken."""
    if team in table:
        return table[team]
    held = set(table.values())
    for uid in range(uids.start, uids.start + uids.count):
        if uid not in held:
            return uid
    raise AdapterError(
        f"team {team!r} needs a uid of its own, but all {uids.count} of control.team_uid_start "
        f"{uids.start} and team_uid_count are taken by other teams; raise team_uid_count"
    )


class TeamIdTable:
    """The teams' uids of one service, in `<state_dir>/team_uids.json`."""

    def __init__(self, state_dir: Path, uids: TeamUids) -> None:
        self.path = state_dir / "team_uids.json"
        self.uids = uids

    def uid(self, team: str) -> int:
        """`team`'s uid, assigned and written down at its first job. Raises AdapterError."""
        try:
            with _LOCK, self._locked():
                table = self._read()
                uid = assign(table, team, self.uids)
                if table.get(team) != uid:
                    write_atomic(str(self.path), json.dumps({**table, team: uid}, indent=1))
                return uid
        except OSError as exc:
            raise AdapterError(
                f"cannot record team {team!r}'s uid in {self.path}: {exc.strerror}; make the "
                "control plane's state_dir writable"
            ) from None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.path.parent)
        fd = os.open(f"{self.path}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise AdapterError(
                f"{self.path} is not the table of teams' uids ({exc}); restore it from a "
                "backup (removing it gives teams new uids: files their jobs left may change hands)"
            ) from None
        return {str(k): int(v) for k, v in data.items()}
