"""The driver: clips in, through prefetch, the stage cache and a runner, results and run.json out.

One thread owns all scheduling state (`flow.Flow`); I/O threads and runner workers only report
back through a queue. Per clip: compute every stage's key (pure), read verified cache hits and
download the clip only if a missing stage needs it (`prefetch.Fetch`, on the I/O pool, bounded by
the prefetch budget), run the missing stages on free replicas of the plan (downstream first, so
clips finish and free memory), then append the clip's reduced record to the journal. A crash
loses at most the clips in flight.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from gpuplane.batch.cache import CacheStats, StageCache
from gpuplane.batch.clips import ClipReader, ClipRef, verified
from gpuplane.batch.errors import BatchError
from gpuplane.batch.flow import ClipState, Flow, Start
from gpuplane.batch.journal import ResultsJournal
from gpuplane.batch.metrics import BusyTimeline, StageMetrics
from gpuplane.batch.packing import CPU, BatchDevice, PackingPlan
from gpuplane.batch.pipeline import Pipeline
from gpuplane.batch.prefetch import Fetch, Prefetcher
from gpuplane.batch.profile import expected_hits, plan_stages, resolve_profile
from gpuplane.batch.runners.base import Runner, Task, TaskResult, WorkerSpec
from gpuplane.batch.summary import JOURNAL, RunRecord, run_header


@dataclass(frozen=True, slots=True)
class RunOptions:
    out_dir: Path
    devices: tuple[BatchDevice, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    prefetch_items: int = 8  # clips held at once: downloading, waiting or computing
    prefetch_bytes: int = 1 << 30
    io_workers: int = 4
    profile: Mapping[str, float] | None = None  # seconds per clip per stage (see `profile`)
    heavy_share: float = 0.5
    max_replicas: int = 16  # per module: bounds processes (local) and actors (Ray)
    calibrate: bool = False  # time one clip through the chain when no profile is known
    verify_clips: bool = False  # key clips by a digest of their bytes, not the store's metadata


PROBE_CLIPS = 8
"""Clips whose cache entries are checked before planning, to discount stages likely to hit."""


class Observer(Protocol):
    def on_start(self, stages: list[str], total: int | None, plan: PackingPlan) -> None: ...
    def on_update(self, metrics: Mapping[str, StageMetrics], done: int) -> None: ...


@dataclass(slots=True)
class _Invocation:
    """What one `Driver.run` holds while its clips flow; only the driver's thread touches it."""

    clips: Iterator[ClipRef]
    flow: Flow
    prefetcher: Prefetcher
    journal: ResultsJournal
    record: RunRecord
    timeline: BusyTimeline
    events: queue.SimpleQueue[tuple[Any, ...]] = field(default_factory=queue.SimpleQueue)
    pending: ClipRef | None = None  # the next clip, waiting for room in the prefetch budget
    exhausted: bool = False
    done: int = 0
    errors: int = 0
    last_update: float = 0.0


def _post(events: queue.SimpleQueue[tuple[Any, ...]], *head: Any) -> None:
    """Future callback: hand (kind, ..., future) to the driver thread."""
    events.put(head)


class Driver:
    """Runs one pipeline over a stream of clips: one invocation of a run (see `summary`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        spec: WorkerSpec,
        runner: Runner,
        options: RunOptions,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pipeline = pipeline
        self.spec = spec
        self.runner = runner
        self.opts = options
        self.observer = observer
        self.clock = clock
        self.cache = (
            StageCache(spec.cache_url, dict(spec.cache_options)) if spec.cache_url else None
        )
        self.metrics = {s.name: StageMetrics() for s in pipeline.stages}
        self.hit_estimate: dict[str, float] = {}
        self.profile_source = ""
        self.reader = ClipReader(options.storage_options)
        self.fetch = Fetch(pipeline, self.cache, self.reader, options.verify_clips)

    def plan(
        self, sample: ClipRef | None, probe: Sequence[ClipRef] = ()
    ) -> tuple[PackingPlan, dict[str, float]]:
        """Seconds per clip (see `profile`), discounted by the expected cache hits, packed."""
        mem = self.opts.devices[0].mem_mib if self.opts.devices else 81920
        timer = None
        if self.opts.calibrate and sample is not None:
            timer = partial(self._decoded, sample)
        profile, self.profile_source = resolve_profile(
            self.pipeline, self.opts.profile, self.cache, mem, timer
        )
        if self.opts.verify_clips and self.cache is not None:
            probe = [verified(r, self.reader.read(r)) for r in probe]
        self.hit_estimate = expected_hits(self.pipeline, self.cache, probe)
        plan = plan_stages(
            self.pipeline, profile, self.hit_estimate, self.opts.devices,
            heavy_share=self.opts.heavy_share, max_replicas=self.opts.max_replicas,
        )  # fmt: skip
        return plan, profile

    def _decoded(self, ref: ClipRef) -> Any:
        return self.pipeline.decode(self.reader.read(ref))

    def run(self, clips: Iterable[ClipRef], total: int | None = None) -> dict[str, Any]:
        """Run the clips not yet in the run directory's journal; returns run.json's summary (every
        invocation's clips) and, as `invocation`, what this call did ("nothing_to_do" when every
        clip was done already: then nothing starts and the record's figures stay as they were)."""
        out = self.opts.out_dir
        out.mkdir(parents=True, exist_ok=True)
        journal = ResultsJournal(out / JOURNAL)
        todo = journal.todo(clips)
        try:
            record = RunRecord(out, self.pipeline, self.cache is not None)
            head = list(itertools.islice(todo, PROBE_CLIPS))
            if not head and record.invocations:
                journal.close()
                return record.nothing_to_do(journal.skipped)
            plan, profile = self.plan(head[0] if head else None, head)
        except BaseException:
            journal.close()
            raise
        started = self.clock()
        header = run_header(
            self.pipeline, plan, profile, runner=self.runner.describe(),
            cache_url=self.spec.cache_url, devices=self.opts.devices,
            profile_source=self.profile_source, expected_hits=self.hit_estimate,
        )  # fmt: skip
        timeline = record.begin(header, started)
        if self.observer:
            left = None if total is None else max(0, total - len(journal.done))
            self.observer.on_start([s.name for s in self.pipeline.stages], left, plan)
        status = "failed"
        prefetcher = Prefetcher(
            self.opts.io_workers, self.opts.prefetch_items, self.opts.prefetch_bytes
        )
        flow = Flow(self.pipeline, plan, self.cache is not None)
        inv = _Invocation(itertools.chain(head, todo), flow, prefetcher, journal, record, timeline)
        try:
            self.runner.start(self.spec, plan, self.pipeline)
            self._loop(inv)
            status = "finished" if inv.errors == 0 else "finished_with_errors"
        finally:
            self.runner.stop()
            prefetcher.close()
            journal.close()
            stats = self.cache.stats if self.cache is not None else CacheStats()
            entry = record.entry(started, self.clock(), status, journal.skipped, self.metrics,
                                 stats, prefetcher.usage())  # fmt: skip
            summary = record.close(entry, timeline, failed=status == "failed")
            measured = {n: m.compute_s / m.computed for n, m in self.metrics.items() if m.computed}
            if self.cache is not None and measured:
                self.cache.save_profile(measured)
        return summary | {"invocation": summary["invocations"][-1]}

    def _loop(self, inv: _Invocation) -> None:
        while True:
            self._feed(inv)
            if inv.exhausted and inv.flow.idle:
                break
            self._dispatch(inv)
            kind, *event = inv.events.get()
            if kind == "fetched":
                self._fetched(inv, *event)
            else:
                self._ended(inv, *event)
            now = self.clock()
            if self.observer and now - inv.last_update > 0.1:
                inv.last_update = now
                self.observer.on_update(self.metrics, inv.done)
        if self.observer:
            self.observer.on_update(self.metrics, inv.done)

    def _feed(self, inv: _Invocation) -> None:
        """Start fetches while the prefetch budget has room (the next clip waits in `pending`)."""
        while not inv.exhausted:
            if inv.pending is None:
                inv.pending = next(inv.clips, None)
                if inv.pending is None:
                    inv.exhausted = True
                    return
            ref = inv.pending
            if inv.flow.holds(ref.id):
                raise BatchError(f"clip id {ref.id!r} appears twice in the source")
            load = partial(self.fetch, ref, self.reader.fs_for(ref.url))
            fut = inv.prefetcher.try_submit(ref.size, load)
            if fut is None:
                return
            inv.flow.fetching(ref.id)
            inv.pending = None
            fut.add_done_callback(partial(_post, inv.events, "fetched", ref))

    def _dispatch(self, inv: _Invocation) -> None:
        """Submit every stage that can start now, within replicas and the runner's capacity."""
        while (start := inv.flow.next_start(self.runner.capacity)) is not None:
            task = Task(start.clip.ref.id, start.stage.name, start.key, start.args)
            try:
                fut = self.runner.submit(task, start.replica)
            except Exception:
                inv.flow.unstart(start)
                raise
            fut.add_done_callback(partial(_post, inv.events, "ended", start))

    def _fetched(self, inv: _Invocation, ref: ClipRef, fut: Future[ClipState]) -> None:
        try:
            clip = fut.result()
        except Exception as exc:
            self._fail(inv, ref, "fetch", exc)
            return
        for name in clip.hits:
            self.metrics[name].cached += 1
        if inv.flow.fetched(clip):
            self._finish(inv, clip)

    def _ended(self, inv: _Invocation, start: Start, fut: Future[TaskResult]) -> None:
        if not inv.flow.ended(start):
            return  # the clip already failed in another stage
        try:
            res = fut.result()
        except Exception as exc:
            self._fail(inv, start.clip.ref, start.stage.name, exc)
            return
        replica = start.replica
        share = replica.share if replica.device != CPU else 0.0
        times = self.metrics[start.stage.name].count(res.start, res.end, share, res.bytes_written)
        inv.timeline.add(replica.device, res.start, res.end, share if share else 1.0)
        if inv.flow.computed(start, res.value, times):
            self._finish(inv, start.clip)

    def _finish(self, inv: _Invocation, clip: ClipState) -> None:
        """Reduce the complete clip and append its record to the journal: the clip is done."""
        ident = clip.ref.id
        try:
            reduced = self.pipeline.reduce(ident, clip.values)
        except Exception as exc:  # a bug in the reduction fails this clip, not the run
            self._fail(inv, clip.ref, "reduce", exc)
            return
        rec = {"invocation": inv.record.number, "attempts": inv.record.attempts(ident)}
        inv.journal.append(ident, rec | {"hits": clip.hits, "t": clip.times, "out": reduced})
        self._release(inv, clip.ref)
        inv.done += 1

    def _fail(self, inv: _Invocation, ref: ClipRef, stage: str, exc: BaseException) -> None:
        inv.errors += 1
        if stage in self.metrics:
            self.metrics[stage].errors += 1
        inv.record.error(ref.id, stage, exc)
        self._release(inv, ref)

    def _release(self, inv: _Invocation, ref: ClipRef) -> None:
        inv.flow.drop(ref.id)
        inv.prefetcher.release(ref.size)
