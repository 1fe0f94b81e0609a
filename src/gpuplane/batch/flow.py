"""Which stage of a clip runs next (pure): the clips in flight, their stages, the plan's replicas.

A stage of a clip is ready once each of its inputs is there: a finished upstream stage (computed,
or a verified cache hit) or the decoded clip. Ready stages wait, per stage, for a free replica of
the packing plan; the most downstream stage starts first, so clips finish and free their memory,
and never more tasks than the runner's capacity. A clip that failed is dropped, and its stages
still queued are skipped. No I/O and no clock: the driver fetches, submits and records what this
decides, on its one thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.batch.clips import ClipRef
from gpuplane.batch.packing import PackingPlan, Replica
from gpuplane.batch.pipeline import CLIP, CachePolicy, Pipeline, Stage


@dataclass(slots=True)
class ClipState:
    """One clip in flight: its cache keys, the stages it has (hits and computed) with their
    values, the decoded clip while a stage still to run reads it, the stages queued or running,
    and the (compute, device) seconds of each computed stage."""

    ref: ClipRef
    keys: Mapping[str, str]
    values: dict[str, Any] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    data: Any = None
    running: set[str] = field(default_factory=set)
    times: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Start:
    """A stage of a clip to start on a replica, as `Flow.next_start` decided it."""

    clip: ClipState
    stage: Stage
    replica: Replica
    key: str | None  # the cache entry the runner writes the result to; None: not cached

    @property
    def args(self) -> tuple[Any, ...]:
        return self.stage.inputs_from(self.clip.data, self.clip.values)


def reads_clip(pipeline: Pipeline, finished: Collection[str]) -> bool:
    """Whether a stage not among `finished` reads the decoded clip: else the clip's bytes are
    not read, or the decoded clip is let go."""
    return any(CLIP in s.inputs and s.name not in finished for s in pipeline.stages)


class Flow:
    """The clips in flight of one invocation, their queued stages and the plan's free replicas.

    The driver calls `fetching` when a clip's fetch starts and `fetched` when it ended; then
    `next_start` until it answers None (each answer is committed: the replica is taken), and
    `unstart` if the runner refused one; `ended` when a task ended, then `computed` with its
    result; `drop` once the clip is recorded or failed.
    """

    def __init__(self, pipeline: Pipeline, plan: PackingPlan, cache_used: bool) -> None:
        self.pipeline = pipeline
        self.cache_used = cache_used
        self.clips: dict[str, ClipState | None] = {}  # None: its fetch still runs
        self.queued: dict[str, deque[ClipState]] = {s.name: deque() for s in pipeline.stages}
        self.free = {s.name: deque(plan.replicas_of(s.name)) for s in pipeline.stages}
        self.running = 0

    @property
    def idle(self) -> bool:
        return not self.clips

    def holds(self, clip_id: str) -> bool:
        return clip_id in self.clips

    def live(self, clip: ClipState) -> bool:
        """Whether `clip` is still in flight (it did not fail in another stage meanwhile)."""
        return self.clips.get(clip.ref.id) is clip

    def fetching(self, clip_id: str) -> None:
        self.clips[clip_id] = None

    def fetched(self, clip: ClipState) -> bool:
        """Queue the clip's ready stages; True when its cache hits already finished it."""
        self.clips[clip.ref.id] = clip
        return self._advance(clip)

    def next_start(self, capacity: int) -> Start | None:
        """The next stage to start, downstream first, on a free replica of its stage, while
        fewer than `capacity` tasks run; None when nothing can start now."""
        if self.running >= capacity:
            return None
        for s in reversed(self.pipeline.stages):
            queued, free = self.queued[s.name], self.free[s.name]
            while queued and free:
                clip = queued.popleft()
                if self.live(clip):
                    self.running += 1
                    cached = self.cache_used and s.cache is not CachePolicy.OFF
                    return Start(clip, s, free.popleft(), clip.keys[s.name] if cached else None)
        return None

    def unstart(self, start: Start) -> None:
        """The runner refused `start`: its replica is free again."""
        self.running -= 1
        self.free[start.stage.name].appendleft(start.replica)

    def ended(self, start: Start) -> bool:
        """A task ended, either way: its replica is free. False when its clip failed meanwhile."""
        self.running -= 1
        self.free[start.stage.name].append(start.replica)
        return self.live(start.clip)

    def computed(self, start: Start, value: Any, times: tuple[float, float]) -> bool:
        """Record a stage's result and queue what it made ready; True when the clip is complete."""
        clip, name = start.clip, start.stage.name
        clip.times[name] = times
        clip.values[name] = value
        clip.running.discard(name)
        if not reads_clip(self.pipeline, clip.values):
            clip.data = None  # no stage needs the decoded clip any more
        return self._advance(clip)

    def drop(self, clip_id: str) -> None:
        """The clip is recorded, or failed: it leaves, and its queued stages are skipped."""
        del self.clips[clip_id]

    def _advance(self, clip: ClipState) -> bool:
        for s in self.pipeline.stages:
            if s.name in clip.values or s.name in clip.running:
                continue
            if all(clip.data is not None if d == CLIP else d in clip.values for d in s.inputs):
                clip.running.add(s.name)
                self.queued[s.name].append(clip)
        return len(clip.values) == len(self.pipeline.stages)
