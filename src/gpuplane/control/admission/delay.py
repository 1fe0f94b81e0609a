"""Delay scheduling for faster GPUs: a job that would start on a slow card may wait for a fast one.

The slow-server rule of heterogeneous queues (Lin & Kumar, 1984), in the words of the gateway's
delay scheduling (`serve/delay.py`, `DelayScheduler.frees_in_time`): a job the policy would place
on a card of speed s, that may also run on faster models, waits for them when they are expected
to free room for it before the slow card would have gained anything. Without runtime estimates every
running job is taken to have w of work left, w a job's mean work (run seconds x its cards' speed,
learned from completed jobs), so busy cards of speed f free at busy_f x f / w milli-GPU per second
(Little's law). A running job with a time limit is expected to end at its start plus the share
of its limit that completed jobs used (`Estate.expected_ends`); its cards count as freed in the
window when it is expected to end within it, not by the rate. The jobs ahead of it in the queue
that may use the faster models go first. The faster models
are pooled, fastest first (an A10 job waits for an A100 or an L40S, whichever frees first), and
the window is what a long job loses on the slow card: W/s - W/f_min, W the `WORK_QUANTILE` of the
work history, f_min the pool's slowest speed. The rule:

    ahead + own demand <= sum(busy_f x f) x (1/s - 1/f_min) x W/w

(busy_f: the cards of jobs without a limit; plus those of limited jobs expected to end within
W/s - W/f_min.)

The percentile, not the mean, because a pool's finish time is that of its longest jobs: with
unknown, heavy-tailed runtimes the risk of a slow card is a long job landing on it. A job with a
time limit (in seconds on a card of speed 1.0, i.e. an upper bound of its work) is weighed by
its own limit instead: W = its limit, so a long job waits for the fast card and a short one
takes the slow card now.

While a backlog is worked off, the jobs ahead are far more than the faster models free in that
window and nothing changes; as the queue runs short, a job takes a faster model if one fits now,
else it waits for one instead of stretching the makespan on a slow card. No waiting until
`MIN_WORK_SAMPLES` jobs have completed, and no longer than the loss it avoids (the admission
pass keeps when each job first waited: `Estate.delayed`), so a job the faster models keep missing
still starts on the slow card.

Pure: times are passed in, no I/O. `WorkHistory` lives in the `Estate` (fed by `Estate.release`
when a job ends; the admission's queue order also reads its `limit_fill`); `FasterGpuWait` is one
admission pass's scratch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuplane.averages import sample_weight
from gpuplane.control.admission.reasons import PendingReason, waiting_for_faster_gpu
from gpuplane.control.scheduler import (
    MILLI_PER_GPU,
    FloatArray,
    IntArray,
    Request,
    Snapshot,
    filter_when_empty,
)

MIN_WORK_SAMPLES = 8  # completed jobs before a job may wait for a faster model
WORK_EWMA_MIN_WEIGHT = 0.02  # a plain mean of the first 50 jobs, then an EWMA
WORK_QUANTILE = 0.95  # the long jobs a slow card is weighed against
RECENT_WORK = 1024  # completed jobs the quantile is taken over


@dataclass(slots=True)
class WorkHistory:
    """Completed jobs' work in reference-card seconds (run seconds x their cards' speed): the
    mean and the recent ones (for `long_s`); how much of their time limits the jobs that had one
    used (`limit_fill`); and which GPU models each request shape can ever run on (cached per
    inventory)."""

    mean_s: float = 0.0
    samples: int = 0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_WORK))
    limited: int = 0  # completed jobs that had a time limit
    limited_work_s: float = 0.0  # their work and their limits, averaged alike
    limited_limit_s: float = 0.0
    _models: dict[tuple[object, ...], frozenset[str]] = field(default_factory=dict)
    _inventory: object = None

    def observe(self, run_s: float, speed: float, limit_run_s: float | None = None) -> None:
        """One job completed after `run_s` seconds on cards of relative `speed`; its time limit
        allowed it `limit_run_s` seconds there (None: it had none)."""
        self.samples += 1
        work = max(run_s, 0.0) * speed
        self.mean_s += sample_weight(self.samples, WORK_EWMA_MIN_WEIGHT) * (work - self.mean_s)
        self.recent.append(work)
        if limit_run_s is not None and limit_run_s > 0:
            self.limited += 1
            weight = sample_weight(self.limited, WORK_EWMA_MIN_WEIGHT)
            self.limited_work_s += weight * (work - self.limited_work_s)
            self.limited_limit_s += weight * (limit_run_s * speed - self.limited_limit_s)

    def limit_fill(self) -> float:
        """The share of their time limits that completed jobs used: users overstate run times
        (by 2x on average when they give 1-3x, as in Mu'alem & Feitelson's f-model), so a sum
        of limits overstates the work by 1 / this. 1.0 until `MIN_WORK_SAMPLES` jobs with a
        limit completed."""
        if self.limited < MIN_WORK_SAMPLES or self.limited_limit_s <= 0:
            return 1.0
        return min(1.0, self.limited_work_s / self.limited_limit_s)

    def long_s(self) -> float:
        """The work of a long job: the `WORK_QUANTILE` of the recent completions."""
        return float(np.quantile(np.fromiter(self.recent, float), WORK_QUANTILE))

    @property
    def ready(self) -> bool:
        return self.samples >= MIN_WORK_SAMPLES

    def models(self, snapshot: Snapshot, request: Request) -> frozenset[str]:
        """The GPU models `request` fits on when empty (selector, quota narrowing included)."""
        if self._inventory is not snapshot.inventory_token:
            self._models, self._inventory = {}, snapshot.inventory_token
        key = request.shape
        found = self._models.get(key)
        if found is None:
            rows = filter_when_empty(snapshot, request).nodes
            found = frozenset(snapshot.nodes[int(i)].gpu_model for i in rows)
            self._models[key] = found
        return found


@dataclass(frozen=True, slots=True)
class FasterGpu:
    """The decision to wait: faster models expected to free room for the job in time."""

    models: tuple[str, ...]  # fastest first
    slow_model: str
    wait_s: float  # expected wait until `models` free room for the job
    loss_s: float  # how much longer the slow card would run a long job

    def reason(self, clusters: dict[str, set[str]]) -> PendingReason:
        """The pending reason, on the first cluster of the fastest model."""
        cluster = sorted(clusters.get(self.models[0], {""}))[0]
        return waiting_for_faster_gpu(
            cluster, self.slow_model, self.models[0], self.wait_s, self.loss_s
        )


class FasterGpuWait:
    """One pass's view: speed and busy milli-GPUs per model, and the demand of the jobs met so
    far in queue order that did not start (`queued`), summed by the fastest model each may use
    only when a decision needs it, and only until no job of the pass could wait any more.

    The faster models are pooled, fastest first: a job on an A10 may wait for an A100 or an
    L40S, whichever frees first; it waits when the pool frees, within the time its slowest
    member still gains over the slow card, the room of the jobs ahead that may use the pool."""

    def __init__(
        self,
        snapshot: Snapshot,
        history: WorkHistory,
        longest_limit_s: float,
        ends: Mapping[str, Sequence[tuple[float, int]]],
        now: float,
    ) -> None:
        """`longest_limit_s`: the longest time limit of the pass's jobs (0: none has one).
        `ends`: per GPU model, when each running job with a time limit is expected to end and
        the milli-GPUs it holds (`Estate.expected_ends`); the rest free by Little's law."""
        self.snapshot = snapshot
        self.history = history
        self.now = now
        self.speed: dict[str, float] = {}
        self.busy: dict[str, int] = {}
        busy = snapshot.n_devices * MILLI_PER_GPU - snapshot.gpu_milli_free
        for i, node in enumerate(snapshot.nodes):
            if not node.devices or not snapshot.schedulable[i]:
                continue
            model = node.gpu_model
            self.speed[model] = max(self.speed.get(model, 0.0), float(snapshot.gpu_speed[i]))
            self.busy[model] = self.busy.get(model, 0) + int(busy[i])
        # per model: the known ends, sorted, and the milli-GPUs freed by each of them cumulated;
        # `unknown`: the busy milli-GPUs of jobs without a limit
        self.ends: dict[str, tuple[FloatArray, IntArray]] = {}
        self.unknown = dict(self.busy)
        for model, known in ends.items():
            if model not in self.busy or not known:
                continue
            at = np.array([e for e, _ in known])
            order = np.argsort(at, kind="stable")
            milli = np.array([m for _, m in known], dtype=np.int64)[order]
            self.ends[model] = (at[order], np.cumsum(milli))
            self.unknown[model] = max(self.busy[model] - int(milli.sum()), 0)
        self.stretch = 1.0  # the work W a job is weighed by, over the mean work w
        widest = self.stretch  # the largest W / w of the pass's jobs
        if history.ready and history.mean_s > 0:
            self.stretch = history.long_s() / history.mean_s
            widest = max(self.stretch, longest_limit_s / history.mean_s)
        self.order = sorted(self.speed, key=lambda m: (-self.speed[m], m))  # fastest first
        self.rank = {m: i for i, m in enumerate(self.order)}
        self.ahead = [0] * len(self.order)  # queued demand, by the fastest model it may use
        slowest = min(self.speed.values(), default=1.0)
        # the most each pool (the k fastest models) frees in time for any slower model: once
        # the demand ahead passes it, no job of this pass waits for that pool
        self.cap = [
            self._frees(self.order[:k], slowest, widest) for k in range(1, len(self.order) + 1)
        ]
        self._queue: list[Request] = []
        self._summed = 0

    def queued(self, request: Request) -> None:
        """`request` did not start in this pass: jobs after it find it ahead of them."""
        if request.is_gpu:
            self._queue.append(request)

    def check(self, request: Request, placed_model: str) -> FasterGpu | None:
        """Should `request`, placed by the policy on `placed_model`, wait for faster models (or
        take one of them that fits now)? The largest pool expected to free in time, or None."""
        if not self.history.ready or placed_model not in self.speed:
            return None
        slow = self.speed[placed_model]
        usable = self.history.models(self.snapshot, request)
        own = request.gpu_demand_milli
        stretch = self.stretch
        if request.time_limit_s is not None and self.history.mean_s > 0:
            stretch = request.time_limit_s / self.history.mean_s
        found: tuple[list[str], int] | None = None
        for k in range(1, len(self.order) + 1):
            if self.speed[self.order[k - 1]] <= slow:
                break
            pool = [m for m in self.order[:k] if m in usable and self.busy[m] > 0]
            if not pool:
                continue
            self._sum_ahead()
            ahead = sum(self.ahead[:k])
            if ahead + own <= self._frees(pool, slow, stretch):
                found = (pool, ahead)
        if found is None:
            return None
        pool, ahead = found
        work, fast = self.history.mean_s, min(self.speed[m] for m in pool)
        rate = sum(self.busy[m] * self.speed[m] for m in pool) / max(work, 1e-9)  # milli / s
        loss = stretch * (work / slow - work / fast)
        return FasterGpu(tuple(pool), placed_model, (ahead + own) / rate, loss)

    def _frees(self, pool: list[str], slow: float, stretch: float) -> float:
        """Milli-GPUs `pool` frees within the time its slowest model still gains over a card of
        speed `slow` on work `stretch` x w: the jobs expected to end by then, and for the busy
        cards whose jobs have no limit, Little's law (in units of w: the mean work cancels)."""
        if not pool:
            return 0.0
        fast = min(self.speed[m] for m in pool)
        if fast <= slow:
            return 0.0
        gain = stretch * (1 / slow - 1 / fast)
        by_then = self.now + gain * self.history.mean_s
        total = 0.0
        for m in pool:
            total += self.unknown[m] * self.speed[m] * gain
            if m in self.ends:
                at, freed = self.ends[m]
                k = int(np.searchsorted(at, by_then, side="right"))
                total += int(freed[k - 1]) if k else 0
        return total

    def _sum_ahead(self) -> None:
        """Add the jobs queued since the last call to `ahead`, by the fastest model each may
        use; stop once every pool is past its `cap`."""
        models = self.history.models
        while self._summed < len(self._queue):
            total = 0
            for k, cap in enumerate(self.cap):
                total += self.ahead[k]
                if total < cap:
                    break
            else:
                return
            request = self._queue[self._summed]
            self._summed += 1
            ranks = [self.rank[m] for m in models(self.snapshot, request) if m in self.rank]
            if ranks:
                self.ahead[min(ranks)] += request.gpu_demand_milli
