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
    FloatArray,
    IntArray,
    Request,
)
from gpuplane.control.scheduler.mix_terms import TERMS_DTYPE, Levels, NodeTerms
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
        # selectors in a canonical order, so that the online mix keeps its layout while the
        # classes' popularity order shifts
        by_key = {_sel_key(c.selector): c.selector for c in gpu}
        selectors = {k: by_key[k] for k in sorted(by_key, key=_sel_order)}
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
        # what the tables' shape and meaning depend on: two mixes with one layout differ only in
        # the classes' weights, so `Levels` computed under one hold under the other
        self.layout = (
            use_memory,
            tuple(self.thresholds.tolist()),
            tuple(groups),
            tuple(selectors),
            tuple(self.cpu_levels.tolist()),
            tuple(self.mem_levels.tolist()),
        )
        self._access: tuple[object, IntArray, FloatArray] | None = None

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

    def levels(self, cpu: IntArray, mem: IntArray) -> tuple[IntArray, IntArray]:
        """The CPU and memory level of free `cpu` and `mem` (the classes' requests at or below;
        memory level 1 everywhere when memory does not count)."""
        lc: IntArray = np.searchsorted(self.cpu_levels, cpu, side="right")
        lm: IntArray = (
            np.searchsorted(self.mem_levels, mem, side="right")
            if self.use_memory
            else np.ones(len(lc), dtype=np.int64)
        )
        return lc, lm

    def group_weights(
        self, snap: Snapshot, rows: IntArray, lc: IntArray, lm: IntArray
    ) -> FloatArray:
        """(len(rows), G): weight of each group's classes the nodes have CPU/memory/model for,
        at CPU and memory levels `lc`, `lm`."""
        pattern, table = self.access(snap)
        out: FloatArray = table[pattern[rows], lc, lm]
        return out

    def access(self, snap: Snapshot) -> tuple[IntArray, FloatArray]:
        """Each node's access pattern (which selectors admit it) and the table per pattern:
        table[p, lc, lm, g] = sum of the selectors' tables over pattern p, summed once here
        so that a node's weights are a lookup, the same bits however many rows are asked for.
        Cached per snapshot inventory."""
        if self._access is None or self._access[0] is not snap.inventory_token:
            masks = np.stack([snap.selector_mask(s) for s in self.selectors], axis=1)
            patterns, pattern = np.unique(masks, axis=0, return_inverse=True)
            table = np.stack([self.table[p].sum(axis=0) for p in patterns])
            self._access = (snap.inventory_token, pattern.reshape(-1).astype(np.int64), table)
        return self._access[1], self._access[2]

    def terms(self, cnt: IntArray, usable: IntArray) -> IntArray:
        """[cnt_g >= k_g] U_g for each group (last axis), from counts and free milli per
        threshold."""
        c = cnt[..., self.group_thr]
        u = usable[..., self.group_thr]
        out: IntArray = np.where(c >= self.group_k, u, 0).astype(TERMS_DTYPE)
        return out

    def weigh(self, snap: Snapshot, rows: IntArray, lv: Levels) -> FloatArray:
        """V = sum_g w_g [cnt_g >= k_g] U_g of `rows` (and cards) at levels `lv`."""
        w = self.group_weights(snap, rows, lv.lc, lv.lm)
        if lv.terms.ndim == 3:
            w = w[:, None, :]
        return _dot_last(w, lv.terms)

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
        lv = Levels(*self.levels(snap.cpu_free[rows], snap.mem_free[rows]), self.terms(cnt, usable))
        return NodeTerms(free, ge, cnt, usable, lv, self.weigh(snap, rows, lv))

    def delta(self, cands: Candidates, before: NodeTerms | None = None) -> FloatArray:
        """dV for every candidate: shape (n, D) for a fractional request (-inf where the card
        does not fit), (n,) otherwise. `before`: the candidates' `before` terms, if known."""
        if len(self.thresholds) == 0:  # no GPU tasks known: nothing can become a fragment
            if cands.card_fit is None:
                return np.zeros(len(cands))
            return np.where(cands.card_fit, 0.0, -np.inf)
        b = self.before(cands.snapshot, cands.nodes) if before is None else before
        return self.gain(cands, self.after(cands, b), b.value)

    def gain(self, cands: Candidates, after: Levels, v0: FloatArray) -> FloatArray:
        """dV = V after (its `Levels` from `after`) - V before (`v0`), -inf on cards that do not
        fit a fractional request."""
        v1 = self.weigh(cands.snapshot, cands.nodes, after)
        if cands.card_fit is None:
            out: FloatArray = v1 - v0
            return out
        out = np.where(cands.card_fit, v1 - v0[:, None], -np.inf)
        return out

    def after(self, cands: Candidates, before: NodeTerms) -> Levels:
        """The candidates' `Levels` once the request is placed (on each card, if fractional)."""
        snap, r, rows = cands.snapshot, cands.request, cands.nodes
        free, ge0, cnt, usable = before.free, before.ge, before.cnt, before.usable
        lc, lm = self.levels(snap.cpu_free[rows] - r.cpu_millis, snap.mem_free[rows] - r.memory_mib)
        if not r.is_fractional:
            if r.gpus:
                # whole cards: k wholly free cards go to 0 (they count at every threshold)
                cnt = cnt - r.gpus
                usable = usable - r.gpus * MILLI_PER_GPU
            return Levels(lc, lm, self.terms(cnt, usable))
        assert cands.card_mem is not None
        # the share this request takes from each card, in effective milli (a proportional
        # request's memory never takes a larger share than its compute)
        take: IntArray | int = r.gpu_milli
        if r.gpu_mem_mib is not None:
            take = np.maximum(r.gpu_milli, _mem_share(snap, rows, cands.card_mem))
        left = np.maximum(free - take, 0)
        ge1 = left[..., None] >= self.thresholds
        cnt1 = cnt[:, None, :] - ge0 + ge1
        use1 = usable[:, None, :] - free[..., None] * ge0 + left[..., None] * ge1
        return Levels(lc, lm, self.terms(cnt1, use1))


def _from_counts(
    counts: Counter[tuple[int, int, int, int, tuple[object, ...]]],
    selectors: dict[tuple[object, ...], Selector],
    popularity: float,
    use_memory: bool,
) -> WorkloadMix:
    """The published FGD's typical pods by popularity until they cover `popularity` of the
    requests; weights = shares of the kept requests, which sum to 1 (the published simulator
    renormalises after the cut). The cut is over the shapes FGD keys on (CPU, GPU share, cards,
    model) whether or not memory counts: with `use_memory` a kept shape is split by host memory
    in proportion, so splitting never makes a popular shape look rare and drop out of the cut."""
    by_shape: dict[tuple[int, int, int, tuple[object, ...]], list[tuple[int, int]]] = {}
    for (gpus, milli, cpu, mem, sel), n in counts.items():  # first seen first, among equals
        by_shape.setdefault((gpus, milli, cpu, sel), []).append((mem, n))
    shapes = sorted(by_shape.items(), key=lambda kv: -sum(n for _, n in kv[1]))
    total = sum(counts.values())
    kept: list[tuple[int, int, int, int, int, Selector]] = []
    covered = 0
    for (gpus, milli, cpu, sel), mems in shapes:
        if covered >= popularity * total:
            break
        covered += sum(n for _, n in mems)
        whole = milli == MILLI_PER_GPU and gpus >= 1
        kept += [(gpus if whole else 0, milli, cpu, mem, n, selectors[sel]) for mem, n in mems]
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


def _dot_last(a: FloatArray, b: IntArray | npt.NDArray[np.int32]) -> FloatArray:
    """Sum of the products over the last axis, term by term in order, so that every element's
    bits are the same whatever rows it is computed with (einsum chooses its kernel, and so the
    order of the sum, by shape; the caches recompute subsets of rows)."""
    out: FloatArray = np.cumsum(a * b, axis=-1)[..., -1]  # accumulate: strictly in order
    return out


def _sel_key(s: Selector) -> tuple[object, ...]:
    return (tuple(sorted(s.match_labels.items())), s.gpu_models)


def _sel_order(key: tuple[object, ...]) -> tuple[object, ...]:
    labels, models = key
    assert isinstance(models, frozenset)
    return (labels, tuple(sorted(models)))


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
