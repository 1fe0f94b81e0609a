"""GPU fragmentation of a node with respect to a workload mix (Weng et al., ATC'23), vectorised.

A workload mix is a distribution over task classes t (weight p_t): whole cards (k_t cards) or a
share of one card (m_t milli), plus CPU (and memory). Free GPU on a node is a *fragment* for class t
when t cannot use it: the node lacks the CPU (or memory, or GPU model) for t, or too few cards with
m_t free; otherwise the fragments are the cards with less than m_t free. The node's fragmentation is
the expectation over the mix:

    F = sum_t p_t * frag_t = P * S - V,   V = sum_{t satisfied} p_t * U_t

with S the node's free milli, P = sum_t p_t and U_t = sum of the free milli on cards with at least
m_t free. Placing a task changes F by -(P * r + dV), r its GPU milli, so scoring needs only
dV = V_after - V_before, computed here for every candidate node and every card at once.

Cards are counted by their *effective* free share, min(free compute, free memory / card memory),
so a card whose memory is taken is not free for proportional tasks even if compute is idle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpuplane.control.scheduler.base import Candidates
from gpuplane.control.scheduler.decision import (
    MILLI_PER_GPU,
    BoolArray,
    FloatArray,
    IntArray,
    Request,
)
from gpuplane.control.scheduler.snapshot import Snapshot
from gpuplane.resources import Selector


@dataclass(frozen=True, slots=True)
class TaskClass:
    """One kind of task in the mix, with its share of the arrivals."""

    gpus: int  # whole cards (0 for a fraction or CPU-only)
    milli: int  # milli per card: 1000 for whole cards, the share for a fraction, 0 CPU-only
    cpu_millis: int
    memory_mib: int
    weight: float
    selector: Selector = field(default_factory=Selector)

    @classmethod
    def key_of(
        cls, r: Request, with_memory: bool = True
    ) -> tuple[int, int, int, int, tuple[object, ...]]:
        """The class of `r`; without `with_memory`, requests that differ only in host memory
        are one class (as the published FGD's typical pods: CPU, GPU share, cards, model)."""
        sel = (tuple(sorted(r.selector.match_labels.items())), r.selector.gpu_models)
        milli = MILLI_PER_GPU if r.gpus else r.gpu_milli
        mem = r.memory_mib if with_memory else 0
        return (r.gpus or (1 if r.is_fractional else 0), milli, r.cpu_millis, mem, sel)


@dataclass(slots=True)
class NodeTerms:
    """A node's terms under a mix before a placement, per row: effective free milli per card
    (n, D), whether each card reaches each threshold (n, D, M), the count and free milli of
    those cards (n, M), and V (n,)."""

    free: IntArray
    ge: BoolArray
    cnt: IntArray
    usable: IntArray
    value: FloatArray

    @classmethod
    def empty(cls, nodes: int, devices: int, thresholds: int) -> NodeTerms:
        return cls(
            np.zeros((nodes, devices), dtype=np.int64),
            np.zeros((nodes, devices, thresholds), dtype=bool),
            np.zeros((nodes, thresholds), dtype=np.int64),
            np.zeros((nodes, thresholds), dtype=np.int64),
            np.zeros(nodes),
        )

    def take(self, rows: IntArray) -> NodeTerms:
        return NodeTerms(
            self.free[rows], self.ge[rows], self.cnt[rows], self.usable[rows], self.value[rows]
        )

    def put(self, rows: IntArray, terms: NodeTerms) -> None:
        self.free[rows] = terms.free
        self.ge[rows] = terms.ge
        self.cnt[rows] = terms.cnt
        self.usable[rows] = terms.usable
        self.value[rows] = terms.value


class WorkloadMix:
    """The task-class distribution, preprocessed into lookup tables for fast scoring.

    `use_memory`: a class is satisfied only if the node also has its host memory (the published
    FGD looks at CPU only).
    """

    def __init__(self, classes: Iterable[TaskClass], use_memory: bool = False) -> None:
        self.classes = tuple(c for c in classes if c.weight > 0)
        self.use_memory = use_memory
        self.total_weight = float(sum(c.weight for c in self.classes))
        gpu = [c for c in self.classes if c.milli > 0]
        self.thresholds: IntArray = np.array(sorted({c.milli for c in gpu}), dtype=np.int64)
        # a group = (threshold, cards needed): classes that differ only in CPU, memory, selector
        groups = sorted({(c.milli, max(c.gpus, 1)) for c in gpu})
        self.group_thr: IntArray = np.searchsorted(self.thresholds, [m for m, _ in groups])
        self.group_k: IntArray = np.array([k for _, k in groups], dtype=np.int64)
        selectors = {_sel_key(c.selector): c.selector for c in gpu}
        self.selectors = tuple(selectors.values())
        self.cpu_levels: IntArray = np.array(sorted({c.cpu_millis for c in gpu}), np.int64)
        mems = sorted({c.memory_mib for c in gpu}) if use_memory else [0]
        self.mem_levels: IntArray = np.array(mems, dtype=np.int64)
        # table[s, lc, lm, g]: weight of group g's classes with selector s that fit in CPU level
        # lc and memory level lm (levels count the classes' sorted requests at or below)
        shape = (len(selectors), len(self.cpu_levels) + 1, len(self.mem_levels) + 1, len(groups))
        table = np.zeros(shape)
        group_of = {g: i for i, g in enumerate(groups)}
        selector_of = {k: i for i, k in enumerate(selectors)}
        for c in gpu:
            g = group_of[(c.milli, max(c.gpus, 1))]
            lc = int(np.searchsorted(self.cpu_levels, c.cpu_millis)) + 1
            lm = int(np.searchsorted(self.mem_levels, c.memory_mib if use_memory else 0)) + 1
            table[selector_of[_sel_key(c.selector)], lc:, lm:, g] += c.weight
        self.table = table
        self.any_selector = any(s.match_labels or s.gpu_models for s in self.selectors)
        self._access: tuple[object, npt.NDArray[np.float64]] | None = None

    @classmethod
    def from_requests(
        cls, requests: Iterable[Request], popularity: float = 1.0, use_memory: bool = False
    ) -> WorkloadMix:
        """The distribution of `requests` by class; keep the most popular classes covering
        `popularity` of them (the published FGD keeps 95 %), weights as shares of those kept.
        Host memory tells classes apart only when it counts (`use_memory`)."""
        reqs = list(requests)
        counts = Counter(TaskClass.key_of(r, use_memory) for r in reqs)
        selectors = {TaskClass.key_of(r, use_memory)[4]: r.selector for r in reqs}
        return _from_counts(counts, selectors, popularity, use_memory)

    def __len__(self) -> int:
        return len(self.classes)

    # -- evaluation ------------------------------------------------------------------------

    def group_weights(
        self, snap: Snapshot, rows: IntArray, cpu: IntArray, mem: IntArray
    ) -> FloatArray:
        """(len(rows), G): weight of each group's classes the nodes have CPU/memory/model for."""
        lc = np.searchsorted(self.cpu_levels, cpu, side="right")
        lm = np.searchsorted(self.mem_levels, mem, side="right") if self.use_memory else 1
        if not self.any_selector:
            w: FloatArray = (
                self.table[0, lc, lm]
                if len(self.selectors) == 1
                else (self.table[:, lc, lm].sum(axis=0))
            )
            return w
        access = self.access(snap)[rows]  # (n, S)
        out: FloatArray = np.einsum("ns,sng->ng", access, self.table[:, lc, lm])
        return out

    def access(self, snap: Snapshot) -> npt.NDArray[np.float64]:
        """(nodes, S): 1 where selector s admits the node; cached per snapshot inventory."""
        if self._access is None or self._access[0] is not snap.inventory_token:
            masks = [snap.selector_mask(s) for s in self.selectors]
            self._access = (snap.inventory_token, np.stack(masks, axis=1).astype(np.float64))
        return self._access[1]

    def value(self, w: FloatArray, cnt: IntArray, usable: IntArray) -> FloatArray:
        """V = sum_g w_g [cnt_g >= k_g] U_g over the last axis (groups)."""
        c = cnt[..., self.group_thr]
        u = usable[..., self.group_thr]
        out: FloatArray = np.einsum("...g,...g->...", w, np.where(c >= self.group_k, u, 0))
        return out

    def fragmentation(self, snap: Snapshot) -> FloatArray:
        """F = P * S - V of every node: the free milli the mix's arrivals are expected not to be
        able to use there (0 on a node whose free GPU every class can use)."""
        if len(self.thresholds) == 0:
            out: FloatArray = np.zeros(len(snap))
            return out
        b = self.before(snap, np.arange(len(snap), dtype=np.int64))
        out = self.total_weight * b.free.sum(axis=-1) - b.value
        return out

    def before(self, snap: Snapshot, rows: IntArray) -> NodeTerms:
        """The terms of `rows` before any placement; they depend on the node, not on the
        request, so every request class shares them (see `DeltaCache`)."""
        free = effective_free(snap, rows)
        ge = free[..., None] >= self.thresholds  # (n, D, M)
        cnt: IntArray = ge.sum(axis=-2)
        usable: IntArray = (free[..., None] * ge).sum(axis=-2)
        w = self.group_weights(snap, rows, snap.cpu_free[rows], snap.mem_free[rows])
        return NodeTerms(free, ge, cnt, usable, self.value(w, cnt, usable))

    def delta(self, cands: Candidates, before: NodeTerms | None = None) -> FloatArray:
        """dV for every candidate: shape (n, D) for a fractional request (-inf where the card
        does not fit), (n,) otherwise. `before`: the candidates' `before` terms, if known."""
        snap, r, rows = cands.snapshot, cands.request, cands.nodes
        n = len(rows)
        if len(self.thresholds) == 0:  # no GPU tasks known: nothing can become a fragment
            if cands.card_fit is None:
                return np.zeros(n)
            return np.where(cands.card_fit, 0.0, -np.inf)
        b = self.before(snap, rows) if before is None else before
        free, ge0, cnt, usable, v0 = b.free, b.ge, b.cnt, b.usable, b.value
        cpu, mem = snap.cpu_free[rows], snap.mem_free[rows]
        w1 = self.group_weights(snap, rows, cpu - r.cpu_millis, mem - r.memory_mib)
        if not r.is_fractional:
            if r.gpus:
                # whole cards: k wholly free cards go to 0 (they count at every threshold)
                cnt = cnt - r.gpus
                usable = usable - r.gpus * MILLI_PER_GPU
            out: FloatArray = self.value(w1, cnt, usable) - v0
            return out
        assert cands.card_fit is not None
        assert cands.card_mem is not None
        # the share this request takes from each card, in effective milli (a proportional
        # request's memory never takes a larger share than its compute)
        take: IntArray | int = r.gpu_milli
        if r.gpu_mem_mib is not None:
            take = np.maximum(r.gpu_milli, _mem_share(snap, rows, cands.card_mem))
        after = np.maximum(free - take, 0)
        ge1 = after[..., None] >= self.thresholds
        cnt1 = cnt[:, None, :] - ge0 + ge1
        use1 = usable[:, None, :] - free[..., None] * ge0 + after[..., None] * ge1
        v1 = self.value(w1[:, None, :], cnt1, use1)
        out = np.where(cands.card_fit, v1 - v0[:, None], -np.inf)
        return out


def _from_counts(
    counts: Counter[tuple[int, int, int, int, tuple[object, ...]]],
    selectors: dict[tuple[object, ...], Selector],
    popularity: float,
    use_memory: bool,
) -> WorkloadMix:
    """Classes by popularity until they cover `popularity` of the requests; weights = shares of
    the kept classes, which sum to 1 (the published simulator renormalises after the cut)."""
    total = sum(counts.values())
    kept: list[tuple[int, int, int, int, int, Selector]] = []
    covered = 0
    for (gpus, milli, cpu, mem, sel), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if covered >= popularity * total:
            break
        covered += n
        whole = milli == MILLI_PER_GPU and gpus >= 1
        kept.append((gpus if whole else 0, milli, cpu, mem, n, selectors[sel]))
    classes = (TaskClass(g, m, c, mem, n / covered, sel) for g, m, c, mem, n, sel in kept)
    return WorkloadMix(classes, use_memory=use_memory)


def effective_free(snap: Snapshot, rows: IntArray) -> IntArray:
    """Free share of each card in milli: min(free compute, free memory share); 0 if no card."""
    mem_share = snap.dev_mem_free[rows] * MILLI_PER_GPU // np.maximum(snap.dev_mem_cap[rows], 1)
    free: IntArray = np.minimum(snap.dev_milli_free[rows], mem_share)
    return free


def _mem_share(snap: Snapshot, rows: IntArray, mem: IntArray) -> IntArray:
    share: IntArray = -(-mem * MILLI_PER_GPU // np.maximum(snap.dev_mem_cap[rows], 1))
    return share


def _sel_key(s: Selector) -> tuple[object, ...]:
    return (tuple(sorted(s.match_labels.items())), s.gpu_models)


class OnlineWorkloadMix:
    """A workload mix learned from the requests seen so far (for the live service).

    The tables are rebuilt after 16, 32, 64, ... requests and then every `refresh` requests, so a
    new class counts from the next rebuild and policies' caches survive in between; classes
    covering `popularity` of the requests are kept, as in `WorkloadMix.from_requests`. A job is
    counted once however often it is scheduled (a pending job is retried every pass): the last
    `remember` job ids are kept to tell.
    """

    def __init__(
        self,
        refresh: int = 1024,
        use_memory: bool = False,
        popularity: float = 0.95,
        remember: int = 65_536,
    ) -> None:
        self._counts: Counter[tuple[int, int, int, int, tuple[object, ...]]] = Counter()
        self._selectors: dict[tuple[object, ...], Selector] = {}
        self._total = 0
        self._next_rebuild = 16
        self.refresh = refresh
        self.use_memory = use_memory
        self.popularity = popularity
        self._current: WorkloadMix | None = None
        self._seen: dict[str, None] = {}  # insertion-ordered set of recent job ids
        self.remember = remember

    def observe(self, r: Request) -> None:
        if r.job_id in self._seen:
            return
        self._seen[r.job_id] = None
        if len(self._seen) > self.remember:
            del self._seen[next(iter(self._seen))]
        key = TaskClass.key_of(r, self.use_memory)
        self._counts[key] += 1
        self._selectors.setdefault(key[4], r.selector)
        self._total += 1
        if self._total >= self._next_rebuild:
            self._current = None
            self._next_rebuild = min(2 * self._total, self._total + self.refresh)

    @property
    def mix(self) -> WorkloadMix:
        if self._current is None:
            self._current = _from_counts(
                self._counts, self._selectors, self.popularity, self.use_memory
            )
        return self._current


@dataclass(slots=True)
class _SnapshotCache:
    """What `DeltaCache` keeps for one snapshot: the request-independent `NodeTerms` of every
    row (valid where `versions` matches the snapshot's `node_version`), and dV per class."""

    versions: IntArray
    before: NodeTerms
    classes: dict[tuple[object, ...], tuple[IntArray, FloatArray]]


class DeltaCache:
    """dV per node (and card) for each request class, recomputed only for nodes that changed.

    A node's dV depends only on its own row and the request's class, so across decisions most of
    it stays valid: the snapshot bumps `node_version[i]` whenever row i changes. The terms before
    a placement (`WorkloadMix.before`) depend on the row alone, so they are kept once per node
    and shared by every class. The cache resets when the mix changes, and keeps `max_classes`
    classes for each of the `max_snapshots` snapshots (by `token`) used last.
    """

    def __init__(self, max_classes: int = 512, max_snapshots: int = 4) -> None:
        self.max_classes = max_classes
        self.max_snapshots = max_snapshots
        self._mix: WorkloadMix | None = None
        # per snapshot token (the live one, plus the copies a caller tries things on)
        self._by_token: dict[object, _SnapshotCache] = {}

    def delta(self, mix: WorkloadMix, cands: Candidates) -> FloatArray:
        snap, r, rows = cands.snapshot, cands.request, cands.nodes
        if mix is not self._mix:
            self._mix, self._by_token = mix, {}
        cache = self._by_token.pop(snap.token, None)
        if cache is None:
            empty = NodeTerms.empty(len(snap), snap.max_devices, len(mix.thresholds))
            cache = _SnapshotCache(np.full(len(snap), -1, dtype=np.int64), empty, {})
            if len(self._by_token) >= self.max_snapshots:
                del self._by_token[next(iter(self._by_token))]
        self._by_token[snap.token] = cache
        entries = cache.classes
        key = (r.gpus, r.gpu_milli, r.gpu_mem_mib, r.cpu_millis, r.memory_mib)
        entry = entries.pop(key, None)  # re-inserted below: dicts keep LRU order
        if entry is None:
            shape = (len(snap), snap.max_devices) if r.is_fractional else (len(snap),)
            entry = (np.full(len(snap), -1, dtype=np.int64), np.zeros(shape))
            if len(entries) >= self.max_classes:
                del entries[next(iter(entries))]
        entries[key] = entry
        versions, values = entry
        stale = versions[rows] != snap.node_version[rows]
        if stale.any():
            sub = Candidates(
                snap,
                r,
                rows[stale],
                None if cands.card_fit is None else cands.card_fit[stale],
                None if cands.card_mem is None else cands.card_mem[stale],
            )
            known = self._before(mix, cache, snap, sub.nodes) if len(mix.thresholds) else None
            values[sub.nodes] = mix.delta(sub, known)
            versions[sub.nodes] = snap.node_version[sub.nodes]
        out: FloatArray = values[rows]
        return out

    @staticmethod
    def _before(
        mix: WorkloadMix, cache: _SnapshotCache, snap: Snapshot, rows: IntArray
    ) -> NodeTerms:
        """`mix.before` of `rows`, recomputed only for rows changed since it was kept."""
        changed = rows[cache.versions[rows] != snap.node_version[rows]]
        if len(changed):
            cache.before.put(changed, mix.before(snap, changed))
            cache.versions[changed] = snap.node_version[changed]
        return cache.before.take(rows)
