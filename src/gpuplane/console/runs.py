"""The batch runs the control plane can see: the run directories under each team's
`control.runs_dirs` entry, read from their run.json (`batch/summary.py` writes it, whole, by
temp and rename), never written.

Batch runs are not submitted through the control plane, so this configured directory per team is
the only link between the two: a run belongs to the team whose directory holds it, and another
team's run answers exactly as an unknown one.

A run.json is a file a team's own jobs write, so it is checked when read: its shape against
`RunSummary` (what the pages and the batch tier's report shapers index), and none of what the
console reads may be a symbolic link (a link in one team's directory could point at another
team's run, or anywhere the service may read). A run that fails either is shown as an error row
naming its file and what is wrong with it, never a page that fails for every team.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuplane.control.errors import NotFoundError
from gpuplane.errors import unknown_name

RUN = "run.json"  # `batch.summary.RUN`; not imported: the batch tier's modules need its extra
# what the run page reads besides run.json: `batch.summary.JOURNAL` and `ERRORS`
READ = (RUN, "results.jsonl", "errors.jsonl")


class _Open(BaseModel):
    """A part of run.json: the fields the console reads are checked, the rest kept as is."""

    model_config = ConfigDict(extra="allow")


class ClipCounts(_Open):
    done: int = Field(0, ge=0)
    errors: int = Field(0, ge=0)
    invocations: int = Field(0, ge=0)


class StageCacheFigures(_Open):
    hit_rate: float = 0.0


class StageFigures(_Open):
    computed: int = 0
    cached: int = 0
    errors: int = 0
    compute_s: float = 0.0
    device_s: float = 0.0
    cache: StageCacheFigures = Field(default_factory=StageCacheFigures)


class Invocation(_Open):
    invocation: int
    started_at: float
    status: str = "running"
    done: int = 0  # filled in when the invocation ends; 0 while it runs
    errors: int = 0
    wall_s: float | None = None
    skipped_already_done: int | None = None


class RunSummary(_Open):
    """What the console's run pages (and `batch.report`'s shapers) read of a run.json; a run
    still running lacks most figures, which default to none done."""

    pipeline: str = ""
    fingerprint: str = ""
    status: str = "unknown"
    started_at: float | None = None
    wall_s: float | None = None
    throughput_clips_per_s: float | None = None
    device_seconds: float | None = None
    clips: ClipCounts = Field(default_factory=ClipCounts)
    stages: dict[str, StageFigures] = Field(default_factory=dict)
    invocations: list[Invocation] = Field(default_factory=list)
    aggregate: dict[str, Any] | None = None
    runner: dict[str, Any] = Field(default_factory=dict)
    plan: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)


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
        for path in sorted(Path(root).glob("*")):
            if path.is_symlink() or os.path.lexists(path / RUN):
                runs.append(_read(team, path))
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
    """The run in directory `path`, or an error row saying why it cannot be shown."""
    linked = [p for p in (path, *(path / name for name in READ)) if p.is_symlink()]
    if linked:
        return Run(team, path.name, path, None, f"{linked[0]} is a symbolic link: not followed")
    try:
        doc = json.loads((path / RUN).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return Run(team, path.name, path, None, f"cannot read {path / RUN}: {exc}")
    try:
        summary = RunSummary.model_validate(doc)
    except ValidationError as exc:
        wrong = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'the document'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
        return Run(team, path.name, path, None, f"{path / RUN} is not a run summary: {wrong}")
    return Run(team, path.name, path, summary.model_dump())
