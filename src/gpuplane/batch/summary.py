"""The run record: run.json, folded from the journal and the error log of every invocation.

A run directory holds one run, however many invocations of `gpuplane batch run` it took (the
same command again resumes it). What is known per clip lives in the journal (which invocation
finished it, after how many attempts, which stages were cache hits, what the others cost) and
each failed attempt in `errors.jsonl`; run.json's clip, stage and aggregate figures are folded
from those two files, so a resumed run reports every clip whichever invocation computed it, and a
re-run with nothing to do leaves them as they were. What only an invocation knows (its wall
time, cache I/O, prefetch peaks, timeline) is one entry of run.json's `invocations`, appended.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplane.batch.cache import CacheStats
from gpuplane.batch.errors import BatchError
from gpuplane.batch.journal import iter_records
from gpuplane.batch.metrics import BusyTimeline, StageMetrics
from gpuplane.batch.packing import BatchDevice, PackingPlan
from gpuplane.batch.pipeline import Pipeline

RUN = "run.json"
JOURNAL = "results.jsonl"
ERRORS = "errors.jsonl"
DERIVED = ("status", "started_at", "finished_at", "wall_s", "clips", "throughput_clips_per_s",
           "device_seconds", "stages", "timeline", "aggregate", "invocations", "nulls")  # fmt: skip
"""run.json's keys folded by `RunRecord.close`; the others are the latest invocation's header."""


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Temp and rename: a reader (or a kill) sees the old document or the new one, whole.
    Strict JSON: a NaN or an infinity is a bug to fix where it is made (null with a note)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, default=str, allow_nan=False))
    tmp.replace(path)


def finite(doc: Any, where: str = "") -> tuple[Any, dict[str, str]]:
    """`doc` with each NaN or infinity (JSON has neither; a pipeline's metric may be one, e.g.
    the minimum of nothing) as None, and a note per replaced value keyed by its path."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None, {where: f"{doc} (JSON has no {'NaN' if math.isnan(doc) else 'infinity'})"}
    notes: dict[str, str] = {}
    if isinstance(doc, Mapping):
        out: dict[Any, Any] = {}
        for k, v in doc.items():
            out[k], more = finite(v, f"{where}.{k}" if where else str(k))
            notes |= more
        return out, notes
    if isinstance(doc, list | tuple):
        items = []
        for i, v in enumerate(doc):
            item, more = finite(v, f"{where}[{i}]")
            items.append(item)
            notes |= more
        return items, notes
    return doc, notes


def run_header(
    pipeline: Pipeline,
    plan: PackingPlan,
    profile: Mapping[str, float],
    *,
    runner: Mapping[str, Any],
    cache_url: str | None,
    devices: Sequence[BatchDevice],
    profile_source: str,
    expected_hits: Mapping[str, float],
) -> dict[str, Any]:
    """What the latest invocation ran: the pipeline's versions, the runner and its packing plan."""
    return {
        "pipeline": pipeline.name,
        "fingerprint": pipeline.fingerprint(),
        "runner": dict(runner),
        "cache_url": cache_url,
        "versions": {s.name: s.version for s in pipeline.stages},
        "devices": [{"id": d.id, "mem_mib": d.mem_mib} for d in devices],
        "profile_s": dict(profile),
        "profile_source": profile_source,
        "expected_hit_rate": dict(expected_hits),
        "plan": plan.to_dict(),
    }


@dataclass(slots=True)
class ErrorLog:
    """`errors.jsonl` counted: failed attempts per clip, per stage and per invocation."""

    per_clip: Counter[str] = field(default_factory=Counter)
    per_stage: Counter[str] = field(default_factory=Counter)
    per_invocation: Counter[int] = field(default_factory=Counter)
    stage_of: dict[str, str] = field(default_factory=dict)  # the stage of a clip's last failure


def read_errors(path: Path) -> ErrorLog:
    log = ErrorLog()
    if not path.exists():
        return log
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue  # torn by a kill (maybe with the next line appended): that attempt is lost
        log.per_clip[e["clip"]] += 1
        log.stage_of[e["clip"]] = e["stage"]
        log.per_stage[e["stage"]] += 1
        log.per_invocation[e.get("invocation", 0)] += 1  # 0: written before invocations were
    return log


@dataclass(slots=True)
class JournalFold:
    """The journal's records folded: the run's clip and stage figures and its aggregate."""

    clips: int
    stages: dict[str, StageMetrics]
    per_invocation: Counter[int]
    unresolved: set[str]  # clips that failed and are not in the journal (yet)
    aggregate: dict[str, Any] | None


def fold_journal(
    path: Path, pipeline: Pipeline, cache_used: bool, failed: set[str], aggregate: bool
) -> JournalFold:
    """One streaming pass over the journal; `failed` are the ids in the error log."""
    stages = {s.name: StageMetrics() for s in pipeline.stages}
    cache_read = {s.name for s in pipeline.looked_up()} if cache_used else set()
    per_invocation: Counter[int] = Counter()
    unresolved = set(failed)
    acc: dict[str, Any] = {}
    n = 0
    for rec in iter_records(path):
        n += 1
        per_invocation[rec.get("invocation", 0)] += 1  # 0: a record from before invocations
        unresolved.discard(rec["clip"])
        hits, times = set(rec.get("hits", ())), rec.get("t", {})
        for name, m in stages.items():
            if name in hits:
                m.cached += 1
                m.cache.hits += 1
                continue
            m.computed += 1
            m.cache.misses += name in cache_read
            compute_s, device_s = times.get(name, (0.0, 0.0))
            m.compute_s += compute_s
            m.device_s += device_s
        if aggregate and pipeline.aggregate is not None:
            acc = pipeline.aggregate(acc, rec.get("out", {}))
    agg = acc if aggregate and pipeline.aggregate is not None else None
    return JournalFold(n, stages, per_invocation, unresolved, agg)


class RunRecord:
    """run.json of one run directory across its invocations.

    Only the driver uses it, while it holds the journal's lock: construct (refuses a directory
    of another pipeline version), `begin` once work is planned, `error` per failed clip, then
    `close` once with this invocation's `entry`, also when the invocation failed
    (`nothing_to_do` closes one that had nothing to do).
    """

    def __init__(self, out: Path, pipeline: Pipeline, cache_used: bool) -> None:
        self.out = out
        self.pipeline = pipeline
        self.cache_used = cache_used
        self.prior = _prior(out, pipeline)
        self.header = {k: v for k, v in self.prior.items() if k not in DERIVED}
        # an entry still "running" is an invocation that was killed: we hold the lock now
        self.invocations = [
            e | {"status": "interrupted"} if e["status"] == "running" else e
            for e in self.prior.get("invocations", [])
        ]
        self.number = self.invocations[-1]["invocation"] + 1 if self.invocations else 1
        self._failures = read_errors(out / ERRORS).per_clip

    def attempts(self, clip: str) -> int:
        """This invocation's attempt at `clip` counted with the failed ones before it."""
        return self._failures[clip] + 1

    def error(self, clip: str, stage: str, exc: BaseException) -> None:
        line = {"clip": clip, "stage": stage, "error": repr(exc), "invocation": self.number}
        with (self.out / ERRORS).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")

    def nothing_to_do(self, skipped: int) -> dict[str, Any]:
        """Close an invocation that found every clip done: run.json stays as it was."""
        idle = {"status": "nothing_to_do", "done": 0, "skipped_already_done": skipped}
        return self.close(None, None) | {"invocation": idle | {"errors": 0}}

    def entry(
        self,
        started: float,
        ended: float,
        status: str,
        skipped: int,
        metrics: Mapping[str, StageMetrics],
        stats: CacheStats,
        prefetch: Mapping[str, int],
    ) -> dict[str, Any]:
        """This invocation's entry in run.json's `invocations`: what the journal cannot hold."""
        cache = {
            n: {"corrupt": stats.of(n).corrupt, "bytes_read": stats.of(n).bytes_read,
                "writes": m.cache.writes, "bytes_written": m.cache.bytes_written}
            for n, m in metrics.items()
        }  # fmt: skip
        return {
            "invocation": self.number,
            "started_at": started,
            "finished_at": ended,
            "wall_s": ended - started,
            "status": status,
            "skipped_already_done": skipped,
            "cache": cache,
            "prefetch": dict(prefetch),
        }

    def begin(self, header: Mapping[str, Any], started: float) -> BusyTimeline:
        """Mark this invocation running in run.json; returns the run's timeline to extend."""
        self.header = dict(header)
        # what a kill leaves: the rest is known when the invocation ends
        entry: dict[str, Any] = {
            "invocation": self.number, "started_at": started, "finished_at": None,
            "wall_s": None, "status": "running", "skipped_already_done": None,
            "cache": {}, "prefetch": None,
        }  # fmt: skip
        running = {"status": "running", "invocations": [*self.invocations, entry]}
        write_json(self.out / RUN, self.prior | self.header | running)
        ran = sum(e["wall_s"] for e in self.invocations if e["wall_s"] is not None)
        return BusyTimeline.resume(self.prior.get("timeline"), started - ran)

    def close(
        self, entry: Mapping[str, Any] | None, timeline: BusyTimeline | None, failed: bool = False
    ) -> dict[str, Any]:
        """Fold the journal and the error log with the invocations into run.json and return it.

        `entry` is this invocation's (None: it had nothing to do, and the figures stay as
        they were); `failed` leaves the aggregate out, the run having stopped on an error.
        """
        invocations = [dict(e) for e in (*self.invocations, *([entry] if entry else []))]
        errors = read_errors(self.out / ERRORS)
        fold = fold_journal(
            self.out / JOURNAL, self.pipeline, self.cache_used, set(errors.per_clip), not failed
        )
        for e in invocations:
            e["done"] = fold.per_invocation[e["invocation"]]
            e["errors"] = errors.per_invocation[e["invocation"]]
            for name, io in e["cache"].items():
                if name in fold.stages:
                    c = fold.stages[name].cache
                    c.corrupt += io["corrupt"]
                    c.bytes_read += io["bytes_read"]
                    c.writes += io["writes"]
                    c.bytes_written += io["bytes_written"]
        for name, n in errors.per_stage.items():
            if name in fold.stages:
                fold.stages[name].errors = n
        ended = [e for e in invocations if e["wall_s"] is not None]
        wall = sum(e["wall_s"] for e in ended)
        timed = sum(e["done"] for e in ended)
        status = "finished_with_errors" if fold.unresolved else "finished"
        summary = self.header | {
            "status": "failed" if failed else status,
            "started_at": invocations[0]["started_at"] if invocations else None,
            "finished_at": invocations[-1]["finished_at"] if invocations else None,
            "wall_s": wall,
            "clips": {
                "done": fold.clips,
                "errors": len(fold.unresolved),
                "invocations": len(invocations),
            },
            "throughput_clips_per_s": timed / wall if wall > 0 else 0.0,
            "device_seconds": sum(m.device_s for m in fold.stages.values()),
            "stages": {n: m.to_dict() for n, m in fold.stages.items()},
            "timeline": timeline.to_dict() if timeline else self.prior.get("timeline", {}),
            "invocations": invocations,
        }
        if fold.aggregate is not None:
            summary["aggregate"] = fold.aggregate
        clean, nulls = finite(summary)
        doc: dict[str, Any] = clean | ({"nulls": nulls} if nulls else {})
        write_json(self.out / RUN, doc)
        return doc


def used_versions(runs_dir: Path) -> dict[str, set[str]]:
    """Per stage, the versions that the runs under `runs_dir` recorded in their run.json (what
    `cache gc --superseded` keeps)."""
    used: dict[str, set[str]] = {}
    for path in sorted(runs_dir.glob(f"*/{RUN}")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BatchError(
                f"cannot read {path} ({exc}): its run's cache versions are unknown; repair or "
                "delete that run directory, or gc without --superseded"
            ) from None
        for stage, version in doc.get("versions", {}).items():
            used.setdefault(stage, set()).add(str(version))
    return used


def _prior(out: Path, pipeline: Pipeline) -> dict[str, Any]:
    path = out / RUN
    if not path.exists() or not (out / JOURNAL).exists():
        return {}
    prior: dict[str, Any] = json.loads(path.read_text())
    if prior.get("fingerprint") != pipeline.fingerprint():
        raise BatchError(
            f"{out} holds results of another pipeline version "
            f"({prior.get('fingerprint')} vs {pipeline.fingerprint()}); "
            "pass a different --out, or delete that directory to start over"
        )
    return prior
