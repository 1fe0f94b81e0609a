"""The fragmentation policies' cache of dV per node and request class (`DeltaCache`).

A node's dV under a workload mix (`fragmentation.py`) depends only on its own row, so across
decisions most of it stays valid; this keeps it per snapshot and class and recomputes only the
rows whose `node_version` moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuplane.control.scheduler.base import Candidates
from gpuplane.control.scheduler.decision import BoolArray, FloatArray, IntArray
from gpuplane.control.scheduler.fragmentation import WorkloadMix
from gpuplane.control.scheduler.mix_terms import Levels, NodeTerms
from gpuplane.control.scheduler.snapshot import Snapshot


@dataclass(slots=True)
class _ClassCache:
    """dV of one request class per row (valid where `versions` matches the snapshot's
    `node_version`), with the `Levels` after the placement and the cards that fit, so that new
    weights of the same layout need only `WorkloadMix.gain` again; `mix`: the weights used."""

    versions: IntArray
    values: FloatArray
    after: Levels
    fit: BoolArray | None
    mix: WorkloadMix


@dataclass(slots=True)
class _SnapshotCache:
    """What `DeltaCache` keeps for one snapshot: the request-independent `NodeTerms` of every
    row (valid where `versions` matches the snapshot's `node_version`; V under `mix`), and
    each class's `_ClassCache`."""

    versions: IntArray
    before: NodeTerms
    mix: WorkloadMix
    classes: dict[tuple[object, ...], _ClassCache]


class DeltaCache:
    """dV per node (and card) for each request class, recomputed only for nodes that changed.

    A node's dV depends only on its own row and the request's class, so across decisions most of
    it stays valid: the snapshot bumps `node_version[i]` whenever row i changes. The terms before
    a placement (`WorkloadMix.before`) depend on the row alone, so they are kept once per node
    and shared by every class. When the mix changes only its weights (same `layout`, as the
    online mix does once its classes are known), the kept `Levels` are weighed again instead of
    recomputed; any other change of mix empties the cache. It keeps `max_classes` classes for
    each of the `max_snapshots` snapshots (by `token`) used last.
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
            if self._mix is None or mix.layout != self._mix.layout:
                self._by_token = {}
            self._mix = mix
        if len(mix.thresholds) == 0:  # nothing to keep: dV is 0 wherever the request fits
            return mix.delta(cands)
        cache = self._snapshot_cache(mix, snap)
        key = (r.gpus, r.gpu_milli, r.gpu_mem_mib, r.cpu_millis, r.memory_mib)
        entry = cache.classes.pop(key, None)  # re-inserted below: dicts keep LRU order
        if entry is None:
            cards = (snap.max_devices,) if r.is_fractional else ()
            entry = _ClassCache(
                np.full(len(snap), -1, dtype=np.int64),
                np.zeros((len(snap), *cards)),
                Levels.empty(len(snap), *cards, len(mix.group_k)),
                np.zeros((len(snap), snap.max_devices), dtype=bool) if r.is_fractional else None,
                mix,
            )
            if len(cache.classes) >= self.max_classes:
                del cache.classes[next(iter(cache.classes))]
        cache.classes[key] = entry
        if entry.mix is not mix:  # new weights: weigh the kept rows again
            kept = np.flatnonzero(entry.versions == snap.node_version)
            fit = None if entry.fit is None else entry.fit[kept]
            again = Candidates(snap, r, kept, fit)
            entry.values[kept] = mix.gain(again, entry.after.take(kept), cache.before.value[kept])
            entry.mix = mix
        stale = entry.versions[rows] != snap.node_version[rows]
        if stale.any():
            sub = Candidates(
                snap,
                r,
                rows[stale],
                None if cands.card_fit is None else cands.card_fit[stale],
                None if cands.card_mem is None else cands.card_mem[stale],
            )
            before = self._before(mix, cache, snap, sub.nodes)
            after = mix.after(sub, before)
            entry.values[sub.nodes] = mix.gain(sub, after, before.value)
            entry.after.put(sub.nodes, after)
            if entry.fit is not None:
                entry.fit[sub.nodes] = sub.card_fit
            entry.versions[sub.nodes] = snap.node_version[sub.nodes]
        out: FloatArray = entry.values[rows]
        return out

    def _snapshot_cache(self, mix: WorkloadMix, snap: Snapshot) -> _SnapshotCache:
        """The snapshot's cache (most recently used last), V before weighed under `mix`."""
        cache = self._by_token.pop(snap.token, None)
        if cache is None:
            terms = NodeTerms.empty(
                len(snap), snap.max_devices, len(mix.thresholds), len(mix.group_k)
            )
            cache = _SnapshotCache(np.full(len(snap), -1, dtype=np.int64), terms, mix, {})
            if len(self._by_token) >= self.max_snapshots:
                del self._by_token[next(iter(self._by_token))]
        self._by_token[snap.token] = cache
        if cache.mix is not mix:
            kept = np.flatnonzero(cache.versions == snap.node_version)
            cache.before.value[kept] = mix.weigh(snap, kept, cache.before.levels.take(kept))
            cache.mix = mix
        return cache

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
