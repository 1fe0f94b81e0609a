"""The scheduler's state: the `Snapshot` of what is free on every node and card, and its commit.

Everything here is pure: no I/O, no clock, no globals. The service builds one `Snapshot` from its
store at start, holds it under a lock and mutates it only through `commit` / `release`; the trace
simulator and the benchmarks build theirs from CSV or synthetic inventories (`nodeinfo.py`). The
same core serves all of them.

Entry points (in `gpuplane.control.scheduler`; the cycle is `cycle.py`):

    schedule(snapshot, request, policy, rng) -> Decision
        Filter → score → pick one node and its devices. Pure: reads the snapshot, never mutates it.
        `decision.placement` is set when the request fits; otherwise `decision.reasons` carries one
        `ClusterReason` per cluster (code + the numbers behind it).
    feasible(snapshot, request) -> Decision
        The same filter against *capacity* instead of free resources: does the request fit on
        an empty estate at all? The service refuses at submit when it does not (200 GiB on
        80 GiB cards, an unknown GPU model, 9 cards on 8-card nodes).
    snapshot.check(placement) -> ClusterReason | None   ask: None when it can be committed
    snapshot.commit(placement) -> None                  re-checks; raises SchedulingConflict
    snapshot.release(job_id) -> Placement | None        idempotent, never raises

Ask-then-commit: `schedule` is a proposal; `commit` checks the devices, node CPU and memory again
and either applies the whole placement or nothing, so a placement computed on a stale view can never
double-book a device. The service holds one lock around schedule + commit (or retries on conflict).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import numpy as np

from gpuplane.control.scheduler.decision import (
    MILLI_PER_GPU,
    BoolArray,
    ClusterReason,
    FloatArray,
    IntArray,
    Placement,
    ReasonCode,
)
from gpuplane.control.scheduler.nodeinfo import NodeInfo, check_table, node_speeds
from gpuplane.errors import GpuplaneError, ResourceError
from gpuplane.resources import Selector


class SchedulingConflict(GpuplaneError):
    """A commit found that the placement no longer fits (someone else took the resources)."""


class Snapshot:
    """Free and used resources of every node and card, as NumPy arrays indexed by node.

    Arrays are public for policies to read (never write): node `cpu_free`, `mem_free`,
    `cpu_cap`, `mem_cap`; cards padded to `max_devices` per node: `dev_mem_cap`, `dev_mem_free`,
    `dev_milli_free` (0 where a card does not exist), `dev_exists`; per-node aggregates kept in
    step with every mutation so filtering is O(nodes), not O(devices): `full_free` (wholly free
    cards), `max_milli_free`, `max_mem_free`, `gpu_milli_free` (sum); `gpu_speed` (read-only:
    each node's relative GPU speed, from its label or the `gpu_speeds` table of GPU model ->
    speed, 1.0 when neither says). `node_version[i]` changes
    whenever row i does, and `token` is unique per snapshot (and per copy), so policies may
    cache per-node results between decisions.

    Not thread-safe: the service holds one lock around schedule + commit and around release.
    `generation` increases on every mutation.
    """

    def __init__(
        self,
        nodes: Iterable[NodeInfo],
        allocations: Iterable[Placement] = (),
        gpu_speeds: Mapping[str, float] | None = None,
    ) -> None:
        self._allocations: dict[str, Placement] = {}
        self._on_node: dict[str, dict[str, Placement]] = {}  # node -> job id -> placement
        self.generation = 0
        self.gpu_speeds: Mapping[str, float] = MappingProxyType(dict(check_table(gpu_speeds)))
        self._build(list(nodes))
        for placement in allocations:
            self.commit(placement)

    # -- construction ----------------------------------------------------------------------

    def _build(self, nodes: list[NodeInfo]) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ResourceError("node names must be unique in a snapshot")
        self.nodes: tuple[NodeInfo, ...] = tuple(nodes)
        self.index: dict[str, int] = {n.name: i for i, n in enumerate(nodes)}
        self.clusters: tuple[str, ...] = tuple(dict.fromkeys(n.cluster for n in nodes))
        cl = {c: i for i, c in enumerate(self.clusters)}
        n = len(nodes)
        d = max((len(x.devices) for x in nodes), default=0)
        self.max_devices = d
        self.node_cluster: IntArray = np.array([cl[x.cluster] for x in nodes], dtype=np.int64)
        self.schedulable: BoolArray = np.array([x.schedulable for x in nodes], dtype=bool)
        self.splittable: BoolArray = np.array([x.splittable for x in nodes], dtype=bool)
        self.cpu_cap: IntArray = np.array([x.cpu_millis for x in nodes], dtype=np.int64)
        self.mem_cap: IntArray = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.n_devices: IntArray = np.array([len(x.devices) for x in nodes], dtype=np.int64)
        self.gpu_speed: FloatArray = node_speeds(nodes, self.gpu_speeds)
        self.dev_exists: BoolArray = np.zeros((n, d), dtype=bool)
        self.dev_mem_cap: IntArray = np.zeros((n, d), dtype=np.int64)
        for i, x in enumerate(nodes):
            if sorted(dv.index for dv in x.devices) != list(range(len(x.devices))):
                raise ResourceError(
                    f"node {x.name}: device indices must be 0..{len(x.devices) - 1}"
                )
            for dv in x.devices:
                self.dev_exists[i, dv.index] = True
                self.dev_mem_cap[i, dv.index] = dv.mem_mib
        self.dev_milli_cap: IntArray = np.where(self.dev_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.dev_mem_free = self.dev_mem_cap.copy()
        self.dev_milli_free = self.dev_milli_cap.copy()
        self.token = object()  # identity of this state's history, for policies' caches
        self.inventory_token = object()  # identity of the node set and labels
        self.node_version: IntArray = np.zeros(n, dtype=np.int64)  # bumped when a row changes
        self.full_free: IntArray = np.zeros(n, dtype=np.int64)
        self.max_milli_free: IntArray = np.zeros(n, dtype=np.int64)
        self.max_mem_free: IntArray = np.zeros(n, dtype=np.int64)
        self.gpu_milli_free: IntArray = np.zeros(n, dtype=np.int64)
        self.max_card_mem: IntArray = self.dev_mem_cap.max(axis=1) if d else np.zeros(n, np.int64)
        # the largest node, for policies that normalise by it
        self.max_node_cpu = max(int(self.cpu_cap.max()) if n else 0, 1)
        self.max_node_gpu_milli = max(d * MILLI_PER_GPU, 1)
        self._refresh(slice(None))
        self._spread: dict[str, IntArray] = {}  # spread group -> its placements per node
        self._selector_cache: dict[tuple[object, ...], BoolArray] = {}
        self.cluster_masks: tuple[BoolArray, ...] = tuple(
            self.node_cluster == i for i in range(len(self.clusters))
        )

    def wholly_free(self, rows: slice | int, milli: IntArray, mem: IntArray) -> BoolArray:
        """Which cards of `rows` are wholly free, given their free compute `milli` and memory
        `mem`: the snapshot's own, or a view with nominations taken off (`nomination.py`)."""
        whole: BoolArray = self.dev_exists[rows] & (milli == self.dev_milli_cap[rows])
        whole &= mem == self.dev_mem_cap[rows]
        return whole

    def _refresh(self, rows: slice | int) -> None:
        """Recompute the per-node aggregates of `rows` from the card arrays."""
        milli = self.dev_milli_free[rows]
        mem = self.dev_mem_free[rows]
        self.full_free[rows] = self.wholly_free(rows, milli, mem).sum(axis=-1)
        if self.max_devices:
            self.max_milli_free[rows] = milli.max(axis=-1)
            self.max_mem_free[rows] = mem.max(axis=-1)
        self.gpu_milli_free[rows] = milli.sum(axis=-1)
        self.node_version[rows] += 1

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def allocations(self) -> Mapping[str, Placement]:
        """Committed placements by job id (read-only view)."""
        return MappingProxyType(self._allocations)

    def speed_of(self, node: str) -> float:
        """The relative GPU speed of `node` (a node name)."""
        return float(self.gpu_speed[self.index[node]])

    def model_of(self, node: str) -> str:
        """The GPU model of `node` (a node name)."""
        return self.nodes[self.index[node]].gpu_model

    def placements_on(self, node: str) -> list[Placement]:
        """The committed placements on `node` (a node name), oldest first."""
        return list(self._on_node.get(node, {}).values())

    def spread_counts(self, group: str) -> tuple[IntArray, IntArray]:
        """How many placements of spread `group` each cluster (by `clusters` index) and each
        node (by row) holds."""
        on_node = self._spread.get(group)
        if on_node is None:
            return np.zeros(len(self.clusters), np.int64), np.zeros(len(self.nodes), np.int64)
        on_cluster = np.bincount(self.node_cluster, weights=on_node, minlength=len(self.clusters))
        return on_cluster.astype(np.int64), on_node

    def selector_mask(self, selector: Selector) -> BoolArray:
        """Nodes whose labels satisfy `selector` (cached per selector; do not mutate)."""
        key = (tuple(sorted(selector.match_labels.items())), selector.gpu_models)
        mask = self._selector_cache.get(key)
        if mask is None:
            mask = np.array([selector.matches(x.all_labels()) for x in self.nodes], dtype=bool)
            mask.setflags(write=False)
            self._selector_cache[key] = mask
        return mask

    def copy(self) -> Snapshot:
        """An independent copy (for dry runs, simulations and what-ifs)."""
        other = Snapshot.__new__(Snapshot)
        other.__dict__.update(self.__dict__)
        for name in _MUTABLE_ARRAYS:
            setattr(other, name, getattr(self, name).copy())
        other._allocations = dict(self._allocations)
        other._on_node = {node: dict(jobs) for node, jobs in self._on_node.items()}
        other._spread = {group: counts.copy() for group, counts in self._spread.items()}
        other._selector_cache = dict(self._selector_cache)
        other.token = object()
        return other

    # -- ask, then commit ------------------------------------------------------------------

    def check(self, placement: Placement) -> ClusterReason | None:
        """Why `placement` cannot be committed now, or None when it can. Pure."""
        conflict = ReasonCode.CONFLICT

        def no(msg: str, **numbers: int) -> ClusterReason:
            return ClusterReason(placement.cluster, conflict, msg, MappingProxyType(numbers))

        if placement.job_id in self._allocations:
            return no(f"job {placement.job_id} already holds an allocation")
        i = self.index.get(placement.node)
        if i is None:
            return no(f"node {placement.node} is not in the inventory")
        node = self.nodes[i]
        if node.cluster != placement.cluster:
            return no(f"node {placement.node} is in cluster {node.cluster}")
        if self.cpu_free[i] < placement.cpu_millis:
            return no(
                "not enough free CPU", requested=placement.cpu_millis, free=int(self.cpu_free[i])
            )
        if self.mem_free[i] < placement.memory_mib:
            return no(
                "not enough free memory", requested=placement.memory_mib, free=int(self.mem_free[i])
            )
        seen: set[int] = set()
        for g in placement.devices:
            if not 0 <= g.index < self.n_devices[i] or g.index in seen:
                return no(f"device {g.index} is not a distinct card of node {placement.node}")
            seen.add(g.index)
            if g.mem_mib < 0 or g.gpu_milli < 0:
                return no("device grants must be >= 0")
            mem_free = int(self.dev_mem_free[i, g.index])
            milli_free = int(self.dev_milli_free[i, g.index])
            if g.mem_mib > mem_free or g.gpu_milli > milli_free:
                return no(
                    f"card {g.index} of {placement.node} no longer has room",
                    device=g.index,
                    mem_requested=g.mem_mib,
                    mem_free=mem_free,
                    milli_requested=g.gpu_milli,
                    milli_free=milli_free,
                )
        if len(placement.devices) > 1 and not all(
            g.mem_mib == self.dev_mem_cap[i, g.index] and g.gpu_milli == MILLI_PER_GPU
            for g in placement.devices
        ):
            return no("a multi-card placement must take whole cards")
        return None

    def commit(self, placement: Placement) -> None:
        """Apply `placement` wholly, after checking it again; raises SchedulingConflict."""
        reason = self.check(placement)
        if reason is not None:
            raise SchedulingConflict(reason.message)
        self._apply(placement, sign=-1)
        self._allocations[placement.job_id] = placement
        self._on_node.setdefault(placement.node, {})[placement.job_id] = placement
        self._count_spread(placement, +1)

    def release(self, job_id: str) -> Placement | None:
        """Give back `job_id`'s resources. Idempotent: a second call returns None, never raises."""
        placement = self._allocations.pop(job_id, None)
        if placement is not None:
            self._apply(placement, sign=+1)
            del self._on_node[placement.node][job_id]
            self._count_spread(placement, -1)
        return placement

    def _count_spread(self, placement: Placement, sign: int) -> None:
        group = placement.spread
        if group is None:
            return
        counts = self._spread.setdefault(group, np.zeros(len(self.nodes), np.int64))
        counts[self.index[placement.node]] += sign
        if not counts.any():
            del self._spread[group]

    def _apply(self, placement: Placement, sign: int) -> None:
        i = self.index[placement.node]
        self.cpu_free[i] += sign * placement.cpu_millis
        self.mem_free[i] += sign * placement.memory_mib
        for g in placement.devices:
            self.dev_mem_free[i, g.index] += sign * g.mem_mib
            self.dev_milli_free[i, g.index] += sign * g.gpu_milli
        self._refresh(i)
        self.generation += 1

    # -- inventory changes -----------------------------------------------------------------

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        """Cordon (False) or uncordon a node; its allocations stay."""
        i = self.index[node]
        self.schedulable[i] = schedulable
        self.generation += 1

    def replace_nodes(
        self, nodes: Iterable[NodeInfo], gpu_speeds: Mapping[str, float] | None = None
    ) -> list[Placement]:
        """Swap in a new inventory (and speed table, when given), keeping the allocations that
        still fit; returns the dropped."""
        kept = list(self._allocations.values())
        if gpu_speeds is not None:
            self.gpu_speeds = MappingProxyType(dict(check_table(gpu_speeds)))
        self._allocations, self._on_node = {}, {}
        self._build(list(nodes))
        dropped: list[Placement] = []
        for placement in kept:
            if self.check(placement) is None:
                self.commit(placement)
            else:
                dropped.append(placement)
        self.generation += 1
        return dropped


_MUTABLE_ARRAYS = (
    "schedulable",
    "node_version",
    "cpu_free",
    "mem_free",
    "dev_mem_free",
    "dev_milli_free",
    "full_free",
    "max_milli_free",
    "max_mem_free",
    "gpu_milli_free",
)
