"""The batch runs the control plane can see: the run directories under each team's
`control.runs_dirs` entry, read from their run.json (`batch/summary.py` writes it, whole, by
temp and rename), never written.

Batch runs are not submitted through the control plane, so this configured directory per team is
the only link between the two: a run belongs to the team whose directory holds it, and another
team's run answers exactly as an unknown one.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplane.control.errors import NotFoundError
from gpuplane.errors import unknown_name

RUN = "run.json"  # `batch.summary.RUN`; not imported: the batch tier's modules need its extra


@dataclass(frozen=True, slots=True)
class Run:
    """One run directory and what its run.json says (`summary` None: unreadable, `error` why)."""

    team: str
    name: str
    path: Path
    summary: dict[str, Any] | None
    error: str | None = None

    @property
    def started_at(self) -> float:
        return float((self.summary or {}).get("started_at") or 0.0)


def list_runs(runs_dirs: Mapping[str, str], teams: Collection[str] | None) -> list[Run]:
    """Every run of `teams` (None: all), the newest first."""
    runs = []
    for team, root in sorted(runs_dirs.items()):
        if teams is not None and team not in teams:
            continue
        for path in sorted(Path(root).glob(f"*/{RUN}")):
            runs.append(_read(team, path.parent))
    return sorted(runs, key=lambda r: r.started_at, reverse=True)


def get_run(
    runs_dirs: Mapping[str, str], team: str, name: str, teams: Collection[str] | None
) -> Run:
    """The run `name` of `team`; NotFoundError when it is not one of `teams`' (None: any)."""
    shown = [r for r in list_runs(runs_dirs, teams) if r.team == team]
    for run in shown:
        if run.name == name:
            return run
    raise NotFoundError(unknown_name(f"batch run of team {team}", name, [r.name for r in shown]))


def _read(team: str, path: Path) -> Run:
    try:
        doc = json.loads((path / RUN).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return Run(team, path.name, path, None, f"cannot read {path / RUN}: {exc}")
    if not isinstance(doc, dict):
        return Run(team, path.name, path, None, f"{path / RUN} is not a run summary")
    return Run(team, path.name, path, doc)
