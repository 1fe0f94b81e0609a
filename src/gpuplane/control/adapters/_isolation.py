"""What keeps one local job from another: whom it runs as, and what holds its processes.

Decided once, at the adapter's start, from the control settings and this machine, and said
there when it falls short: a root service runs each team's jobs as the team's own uid
(`_privilege.TeamUids`, kept by `_team_ids.py`); otherwise every team's jobs share one user, and
a second team's job is refused while another team's run, unless `control.allow_shared_job_user`.
Each job gets a cgroup v2 of its own (`_cgroup.py`) where the service can make one, else its
wrapper is a subreaper (`control.job_containment`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from gpuplane.control.adapters import _cgroup
from gpuplane.control.adapters._privilege import (
    JobUser,
    TeamUids,
    can_run,
    job_user,
    shared_user_note,
)
from gpuplane.control.adapters._team_ids import TeamIdTable
from gpuplane.control.adapters.base import AdapterError, Workload
from gpuplane.control.settings import ControlConfig

log = logging.getLogger("gpuplane.control")
FIX_PYTHON = (
    "install gpuplane where every user can read it, set control.job_user to a user who can, or "
    "set control.allow_root_jobs: true to run jobs as root"
)


class JobIsolation:
    """One local cluster's answer to "as whom, and in what" for each job it starts."""

    def __init__(self, cluster: str, control: ControlConfig) -> None:
        """Raises AdapterError, naming the setting to change, where the settings cannot hold
        on this machine."""
        self.cluster = cluster
        self.allow_shared = control.allow_shared_job_user
        uids = TeamUids(control.team_uid_start, control.team_uid_count)
        try:
            self.who = job_user(control.job_user, control.allow_root_jobs, uids)
        except AdapterError as exc:
            raise AdapterError(f"cluster {cluster}: {exc}") from None
        self.table = TeamIdTable(Path(control.state_dir), uids)
        # services on one machine, and the local clusters of one service, may share the cgroup
        # parent: each names its jobs' apart (a job moved between two local clusters has a copy
        # in each until the first is stopped, which must not stop the second)
        where = f"{os.path.abspath(control.state_dir)}\0{cluster}"
        self.tag = hashlib.sha256(where.encode()).hexdigest()[:10]
        self.containment = self._contain(control.job_containment, control.cgroup_parent)
        self.no_python = self._python_refusal()  # None: job users can run this Python
        self._unenforced_said = False
        self._warn_at_start()

    def _contain(self, mode: str, parent: str | None) -> _cgroup.Containment | None:
        if mode == "subreaper":
            return None
        found = _cgroup.probe(parent)
        if isinstance(found, _cgroup.Containment):
            return found
        if mode == "cgroup":
            raise AdapterError(
                f"cluster {self.cluster}: control.job_containment is cgroup, but {found}; "
                "delegate a cgroup v2 to the service and set control.cgroup_parent, or set "
                "control.job_containment: subreaper"
            )
        log.warning(
            "cluster %s: jobs get no cgroup of their own (%s): their memory and CPU limits are "
            "not enforced, and a process a job leaves behind is stopped only while its "
            "wrapper, a subreaper, lives",
            self.cluster,
            found,
        )
        return None

    def _warn_at_start(self) -> None:
        if (note := shared_user_note(self.who)) is not None:
            then = (
                "control.allow_shared_job_user lets their jobs run at the same time"
                if self.allow_shared
                else "a second team's job is refused while another team's run here "
                "(control.allow_shared_job_user: true allows it)"
            )
            # a warning until the operator has said sharing is fine (as `up` does for its one user)
            level = logging.INFO if self.allow_shared else logging.WARNING
            log.log(level, "cluster %s: %s; %s", self.cluster, note, then)
        if self.containment is not None and self.containment.note is not None:
            # a fact of the machine; it warns once a job asks for a limit it cannot have
            log.info("cluster %s: %s", self.cluster, self.containment.note)
        if self.no_python is not None:
            log.warning(
                "%s, the first on a job's PATH: `python` in a job's command fails with "
                "Permission denied (`python3` finds the system's); %s",
                self.no_python,
                FIX_PYTHON,
            )

    def _python_refusal(self) -> str | None:
        """Why jobs here cannot run this service's Python (None: they can); an instance's
        engine runs in it, so a deployment is not served here while this holds."""
        probe = self.who.probe() if isinstance(self.who, TeamUids) else self.who
        if probe is None or can_run(probe, sys.executable):
            return None
        whom = "their teams' own uids" if isinstance(self.who, TeamUids) else f"user {probe.name}"
        return (
            f"cluster {self.cluster}: jobs run as {whom}, who cannot run this service's Python "
            f"({os.path.realpath(sys.executable)})"
        )

    def refusal(self, team: str | None, running: Iterable[str | None]) -> str | None:
        """Why a job of `team` may not start beside jobs of the teams `running` (None: it may):
        teams sharing one user would see each other's processes."""
        if isinstance(self.who, TeamUids) or self.allow_shared:
            return None
        others = sorted({str(t) for t in running if t != team})
        if not others:
            return None
        return (
            f"cluster {self.cluster} runs every team's jobs as one user and runs team "
            f"{', '.join(others)}'s now, so team {team}'s job would see and signal them; run "
            "the service as root without control.job_user or allow_root_jobs (each team then "
            "gets its own uid), or set control.allow_shared_job_user: true"
        )

    def user(self, team: str | None) -> JobUser | None:
        """Whom `team`'s job runs as (None: the service's own user). Raises AdapterError."""
        if isinstance(self.who, TeamUids):
            name = team or "-"
            return self.who.user(name, self.table.uid(name))
        return self.who

    def cgroup(self, workload: Workload) -> str | None:
        """A new cgroup for the job, with its memory and CPU limits (None: no cgroups here).
        Raises AdapterError."""
        if self.containment is None:
            return None
        files = _cgroup.limit_files(
            workload.memory_mib, workload.cpu_millis, self.containment.limits
        )
        asked = {"memory": workload.memory_mib, "cpu": workload.cpu_millis}
        if not self._unenforced_said and any(
            n > 0 and limit not in self.containment.limits for limit, n in asked.items()
        ):
            self._unenforced_said = True  # once: the same holds for every later job
            log.warning(
                "cluster %s: job %s asks for limits this machine does not enforce: %s",
                self.cluster,
                workload.job_id,
                self.containment.note,
            )
        name = f"{workload.job_id}-{self.tag}"
        try:
            return _cgroup.make(self.containment.parent, name, files)
        except AdapterError as exc:
            raise AdapterError(f"job {workload.job_id}: {exc}") from None
