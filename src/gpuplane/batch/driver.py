"""The driver: clips in, through prefetch, the stage cache and a runner, results and run.json out.

One thread owns all scheduling state; I/O threads and runner workers only report back through a
queue. Per clip: compute every stage's key (pure), read verified cache hits and download the
clip only if a missing stage needs it (I/O pool, bounded by the prefetch budget), run the
missing stages on free replicas of the plan (downstream first, so clips finish and free memory),
then append the clip's reduced record to the journal. A crash loses at most the clips in flight.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from gpuplane.batch.cache import CacheStats, StageCache
from gpuplane.batch.clips import ClipReader, ClipRef, verified
from gpuplane.batch.errors import BatchError
from gpuplane.batch.journal import Journal
from gpuplane.batch.metrics import StageMetrics
from gpuplane.batch.packing import CPU, Device, ModuleProfile, Plan, Replica, plan_packing
from gpuplane.batch.pipeline import CLIP, CachePolicy, Pipeline, cache_keys
from gpuplane.batch.prefetch import Prefetcher
from gpuplane.batch.profile import expected_hits, resolve_profile
from gpuplane.batch.runners.base import Runner, Task, TaskResult, WorkerSpec
from gpuplane.batch.summary import JOURNAL, RunRecord, run_header


@dataclass(frozen=True, slots=True)
class RunOptions:
    out_dir: Path
    devices: tuple[Device, ...]
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
    def on_start(self, stages: list[str], total: int | None, plan: Plan) -> None: ...
    def on_update(self, metrics: Mapping[str, StageMetrics], done: int) -> None: ...


class _Job:
    __slots__ = ("data", "hits", "keys", "ref", "running", "times", "values")

    def __init__(self, ref: ClipRef) -> None:
        self.ref = ref
        self.keys: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.hits: list[str] = []
        self.data: Any = None
        self.running: set[str] = set()
        self.times: dict[str, tuple[float, float]] = {}


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
        self.errors = 0
        self.hit_estimate: dict[str, float] = {}
        self.profile_source = ""
        self.reader = ClipReader(options.storage_options)

    # ---- planning -------------------------------------------------------------------------
    def plan(
        self, sample: ClipRef | None, probe: Sequence[ClipRef] = ()
    ) -> tuple[Plan, dict[str, float]]:
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
        mods = [
            ModuleProfile(
                s.name, s.slice, profile.get(s.name, 0.0) * (1 - self.hit_estimate.get(s.name, 0))
            )
            for s in self.pipeline.stages
        ]
        plan = plan_packing(
            mods,
            self.opts.devices,
            heavy_share=self.opts.heavy_share,
            max_replicas=self.opts.max_replicas,
            max_cpu_replicas=min(4, self.opts.max_replicas),
        )
        return plan, profile

    def _decoded(self, ref: ClipRef) -> Any:
        return self.pipeline.decode(self.reader.read(ref))

    # ---- the run --------------------------------------------------------------------------
    def run(self, clips: Iterable[ClipRef], total: int | None = None) -> dict[str, Any]:
        """Run the clips not yet in the run directory's journal; returns run.json's summary (every
        invocation's clips) and, as `invocation`, what this call did ("nothing_to_do" when every
        clip was done already: then nothing starts and the record's figures stay as they were)."""
        out = self.opts.out_dir
        out.mkdir(parents=True, exist_ok=True)
        journal = Journal(out / JOURNAL)
        skipped = 0

        def fresh() -> Iterator[ClipRef]:
            nonlocal skipped
            for ref in clips:
                if ref.id in journal.done:
                    skipped += 1
                else:
                    yield ref

        todo = fresh()
        try:
            record = self.record = RunRecord(out, self.pipeline, self.cache is not None)
            head = list(itertools.islice(todo, PROBE_CLIPS))
            if not head and record.invocations:
                journal.close()
                idle = {"status": "nothing_to_do", "done": 0, "skipped_already_done": skipped}
                return record.close(None, None) | {"invocation": idle | {"errors": 0}}
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
        self.timeline = record.begin(header, started)
        if self.observer:
            left = None if total is None else max(0, total - len(journal.done))
            self.observer.on_start([s.name for s in self.pipeline.stages], left, plan)
        status = "failed"
        prefetcher = Prefetcher(
            self.opts.io_workers, self.opts.prefetch_items, self.opts.prefetch_bytes
        )
        try:
            self.runner.start(self.spec, plan, self.pipeline)
            self._loop(itertools.chain(head, todo), plan, prefetcher, journal)
            status = "finished" if self.errors == 0 else "finished_with_errors"
        finally:
            self.runner.stop()
            prefetcher.close()
            journal.close()
            entry = self._entry(started, self.clock(), status, skipped, prefetcher)
            summary = record.close(entry, self.timeline, failed=status == "failed")
            measured = {n: m.compute_s / m.computed for n, m in self.metrics.items() if m.computed}
            if self.cache is not None and measured:
                self.cache.save_profile(measured)
        return summary | {"invocation": summary["invocations"][-1]}

    def _entry(
        self, started: float, ended: float, status: str, skipped: int, pf: Prefetcher
    ) -> dict[str, Any]:
        """This invocation's entry in run.json's `invocations`: what the journal cannot hold."""
        stats = self.cache.stats if self.cache is not None else CacheStats()
        cache = {
            n: {"corrupt": stats.of(n).corrupt, "bytes_read": stats.of(n).bytes_read,
                "writes": m.cache.writes, "bytes_written": m.cache.bytes_written}
            for n, m in self.metrics.items()
        }  # fmt: skip
        return {
            "invocation": self.record.number,
            "started_at": started,
            "finished_at": ended,
            "wall_s": ended - started,
            "status": status,
            "skipped_already_done": skipped,
            "cache": cache,
            "prefetch": {"max_items": self.opts.prefetch_items,
                         "max_bytes": self.opts.prefetch_bytes,
                         "peak_items": pf.peak_items, "peak_bytes": pf.peak_bytes},
        }  # fmt: skip

    def _prepare(self, ref: ClipRef, fs: Any) -> _Job:
        """I/O pool: keys, verified cache hits, and the clip's bytes only if a stage needs them
        (always with `verify_clips`, whose digest of the bytes is the clip's version)."""
        raw = self.reader.read(ref, fs) if self.opts.verify_clips else None
        job = _Job(ref if raw is None else verified(ref, raw))
        job.keys = cache_keys(self.pipeline, job.ref.fingerprint)
        if self.cache is not None:
            for s in self.pipeline.stages:
                if s.cache is CachePolicy.USE:
                    hit, value = self.cache.get(s.name, job.keys[s.name])
                    if hit:
                        job.values[s.name] = value
                        job.hits.append(s.name)
        missing = [s for s in self.pipeline.stages if s.name not in job.values]
        if any(CLIP in s.inputs for s in missing):
            job.data = self.pipeline.decode(raw if raw is not None else self.reader.read(ref, fs))
        return job

    def _loop(self, clips: Iterator[ClipRef], plan: Plan, pf: Prefetcher, journal: Journal) -> None:
        stages = self.pipeline.stages
        events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        free = {s.name: deque(plan.replicas_of(s.name)) for s in stages}
        ready: dict[str, deque[_Job]] = {s.name: deque() for s in stages}
        in_flight: dict[str, _Job | None] = {}
        running = 0
        done = 0
        pending: ClipRef | None = None
        exhausted = False
        last_update = 0.0

        def fail(ref: ClipRef, stage: str, exc: BaseException) -> None:
            self.errors += 1
            if stage in self.metrics:
                self.metrics[stage].errors += 1
            self.record.error(ref.id, stage, exc)

        def advance(job: _Job) -> None:
            for s in stages:
                if s.name in job.values or s.name in job.running:
                    continue
                if all(job.data is not None if d == CLIP else d in job.values for d in s.inputs):
                    job.running.add(s.name)
                    ready[s.name].append(job)
            if len(job.values) == len(stages):
                finish(job)

        def finish(job: _Job) -> None:
            nonlocal done
            clip = job.ref.id
            try:
                reduced = self.pipeline.reduce(clip, job.values)
            except Exception as exc:  # a bug in the reduction fails this clip, not the run
                fail(job.ref, "reduce", exc)
                release(job.ref)
                return
            attempts = self.record.attempts(clip)
            record = {"invocation": self.record.number, "attempts": attempts, "hits": job.hits}
            journal.append(clip, record | {"t": job.times, "out": reduced})
            release(job.ref)
            done += 1

        def release(ref: ClipRef) -> None:
            del in_flight[ref.id]
            pf.release(ref.size)

        while True:
            while not exhausted:
                if pending is None:
                    pending = next(clips, None)
                    if pending is None:
                        exhausted = True
                        break
                if pending.id in in_flight:
                    raise BatchError(f"clip id {pending.id!r} appears twice in the source")
                ref = pending
                fut = pf.try_submit(
                    ref.size, partial(self._prepare, ref, self.reader.fs_for(ref.url))
                )
                if fut is None:
                    break
                in_flight[ref.id] = None
                pending = None
                fut.add_done_callback(partial(_post, events, "prepared", ref))
            if exhausted and not in_flight:
                break
            # dispatch: downstream stages first, within replicas and the runner's capacity
            for s in reversed(stages):
                q, slots = ready[s.name], free[s.name]
                while q and slots and running < self.runner.capacity:
                    job = q.popleft()
                    if in_flight.get(job.ref.id) is not job:
                        continue  # the clip failed in another stage
                    pl = slots.popleft()
                    args = tuple(job.data if d == CLIP else job.values[d] for d in s.inputs)
                    cached = self.cache is not None and s.cache is not CachePolicy.OFF
                    key = job.keys[s.name] if cached else None
                    try:
                        f = self.runner.submit(Task(job.ref.id, s.name, key, args), pl)
                    except Exception:
                        slots.appendleft(pl)
                        raise
                    running += 1
                    f.add_done_callback(partial(_post, events, "done", job, s.name, pl))
            ev = events.get()
            if ev[0] == "prepared":
                ref, fut_p = ev[1], ev[2]
                try:
                    job = fut_p.result()
                except Exception as exc:
                    fail(ref, "fetch", exc)
                    release(ref)
                    continue
                in_flight[ref.id] = job
                for name in job.hits:
                    self.metrics[name].cached += 1
                advance(job)
            else:
                _, job, name, pl, fut_t = ev
                running -= 1
                free[name].append(pl)
                if in_flight.get(job.ref.id) is not job:
                    continue  # the clip already failed in another stage
                try:
                    res: TaskResult = fut_t.result()
                except Exception as exc:
                    fail(job.ref, name, exc)
                    release(job.ref)
                    continue
                job.times[name] = self._account(name, pl, res)
                job.values[name] = res.value
                job.running.discard(name)
                if not any(CLIP in s.inputs and s.name not in job.values for s in stages):
                    job.data = None  # no stage needs the raw clip any more
                advance(job)
            now = self.clock()
            if self.observer and now - last_update > 0.1:
                last_update = now
                self.observer.on_update(self.metrics, done)
        if self.observer:
            self.observer.on_update(self.metrics, done)

    def _account(self, stage: str, pl: Replica, res: TaskResult) -> tuple[float, float]:
        """Count a computed stage; returns its (compute, device) seconds for the clip's record."""
        m = self.metrics[stage]
        dt = max(0.0, res.end - res.start)
        m.computed += 1
        m.compute_s += dt
        share = pl.share if pl.device != CPU else 0.0
        m.device_s += dt * share
        m.cache.writes += 1 if res.bytes_written else 0
        m.cache.bytes_written += res.bytes_written
        self.timeline.add(pl.device, res.start, res.end, share if share else 1.0)
        return round(dt, 6), round(dt * share, 6)
