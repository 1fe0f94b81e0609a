"""What goes into `schedule` and what comes out: a request, a placement, reasons, a decision.

Plain frozen data, no I/O, and the array types of the core. Re-exported by
`gpuplane.control.scheduler`.

Units. GPU compute is in *milli-GPU* (1000 = a whole card), as in the Alibaba trace and Kubernetes'
milli notation; `gpu_cores_pct` maps to `10 * pct`. GPU memory is in MiB. A fractional request
without `gpu_mem_mib` takes memory in proportion to its compute share on the card it lands on
(`floor(gpu_milli * card_mem / 1000)`), which is how the trace's `gpu_milli` is replayed; one
without `gpu_cores_pct` reserves no compute (HAMi's default: uncapped, shares what is idle).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import overload

import numpy as np
import numpy.typing as npt

from gpuplane.errors import ResourceError
from gpuplane.resources import Resources, Selector

MILLI_PER_GPU = 1000
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# ---------------------------------------------------------------------------------------------
# Request and placement


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks the scheduler for, in scheduler units.

    Exactly one GPU shape: `gpus >= 1` whole cards on one node, or a fractional share of one card
    (`gpu_milli` compute and/or `gpu_mem_mib` memory), or neither (CPU-only). `time_limit_s`:
    the job's time limit in seconds on a card of speed 1.0 (`nodeinfo.wall_seconds` gives it on a
    node), None when it has none; nominated nodes let a job whose limit ends before their
    expected start use the node meanwhile (`nomination.py`). `spread`: a group of jobs (a
    deployment's version) spread over clusters, then nodes, where capacity allows (`score.py`);
    it never keeps a request from a node that fits.
    """

    job_id: str
    gpus: int = 0
    gpu_milli: int = 0
    gpu_mem_mib: int | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    selector: Selector = field(default_factory=Selector)
    time_limit_s: float | None = None
    spread: str | None = None

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.gpu_milli < 0 or self.cpu_millis < 0 or self.memory_mib < 0:
            raise ResourceError(f"request {self.job_id}: resources must be >= 0")
        if self.gpus and self.is_fractional:
            raise ResourceError(f"request {self.job_id}: whole cards and a fraction are exclusive")
        if self.gpu_milli > MILLI_PER_GPU:
            raise ResourceError(f"request {self.job_id}: gpu_milli must be <= {MILLI_PER_GPU}")
        if self.gpu_mem_mib is not None and self.gpu_mem_mib <= 0:
            raise ResourceError(f"request {self.job_id}: gpu_mem_mib must be > 0")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ResourceError(f"request {self.job_id}: time_limit_s must be > 0")

    @classmethod
    def from_resources(
        cls,
        job_id: str,
        resources: Resources,
        selector: Selector | None = None,
        time_limit_s: float | None = None,
        spread: str | None = None,
    ) -> Request:
        """Map the shared vocabulary (`gpuplane.resources`) to a scheduler request."""
        s = resources.slice
        frac = s.is_fractional
        return cls(
            job_id=job_id,
            gpus=0 if frac else s.gpus,
            gpu_milli=(s.gpu_cores_pct or 0) * 10 if frac else 0,
            gpu_mem_mib=s.gpu_mem_mib if frac else None,
            cpu_millis=resources.cpu_millis,
            memory_mib=resources.memory_mib,
            selector=selector or Selector(),
            time_limit_s=time_limit_s,
            spread=spread,
        )

    @property
    def is_fractional(self) -> bool:
        return self.gpu_milli > 0 or self.gpu_mem_mib is not None

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0 or self.is_fractional

    @property
    def shape(self) -> tuple[object, ...]:
        """Everything but the job id, hashable: requests of one shape fit or fail together."""
        sel = self.selector
        labels = tuple(sorted(sel.match_labels.items()))
        return (
            self.gpus,
            self.gpu_milli,
            self.gpu_mem_mib,
            self.cpu_millis,
            self.memory_mib,
            labels,
            sel.gpu_models,
            self.time_limit_s,
        )

    @property
    def gpu_demand_milli(self) -> int:
        """GPU demand in milli-GPU, as the trace protocol counts it (num_gpu * gpu_milli)."""
        return self.gpus * MILLI_PER_GPU if self.gpus else self.gpu_milli

    @overload
    def mem_on(self, card_mem_mib: int) -> int: ...
    @overload
    def mem_on(self, card_mem_mib: IntArray) -> IntArray: ...
    def mem_on(self, card_mem_mib: int | IntArray) -> int | IntArray:
        """GPU memory this request takes on a card of `card_mem_mib`, or on each card of an
        array of card sizes (whole cards: all of it)."""
        if self.gpus:
            return card_mem_mib
        if self.gpu_mem_mib is None:
            return card_mem_mib * self.gpu_milli // MILLI_PER_GPU
        if isinstance(card_mem_mib, np.ndarray):
            return np.full_like(card_mem_mib, self.gpu_mem_mib)
        return self.gpu_mem_mib


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """What a placement takes from one card."""

    index: int
    mem_mib: int
    gpu_milli: int

    @property
    def cores_pct(self) -> float:
        return self.gpu_milli / 10


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes: one node, its cards (whole, or one shared), CPU and memory; and
    the request's spread group, which the snapshot counts per node (`Snapshot.spread_counts`)."""

    job_id: str
    cluster: str
    node: str
    devices: tuple[DeviceGrant, ...]
    cpu_millis: int
    memory_mib: int
    spread: str | None = None

    @property
    def device_indices(self) -> tuple[int, ...]:
        return tuple(d.index for d in self.devices)

    @property
    def gpu_milli(self) -> int:
        return sum(d.gpu_milli for d in self.devices)


# ---------------------------------------------------------------------------------------------
# Decision


class ReasonCode(StrEnum):
    """Why a request does not fit in one cluster. The same codes in the CLI, the API, metrics."""

    NO_NODES = "NoNodes"  # the cluster has no schedulable node
    NO_MATCHING_NODE = "NoMatchingNode"  # no node's labels satisfy the selector / GPU models
    NOT_SPLITTABLE = "NotSplittable"  # a fractional request, but no matching node shares cards
    EXCEEDS_CAPACITY = "ExceedsCapacity"  # larger than any matching node/card even when empty
    INSUFFICIENT_CPU = "InsufficientCpu"
    INSUFFICIENT_MEMORY = "InsufficientMemory"
    INSUFFICIENT_GPU_MEMORY = "InsufficientGpuMemory"  # no card has that much free GPU memory
    INSUFFICIENT_GPU_CORES = "InsufficientGpuCores"  # no card has that much free compute
    INSUFFICIENT_GPUS = "InsufficientGpus"  # not enough wholly free cards, even in total
    FRAGMENTED = "Fragmented"  # enough free in total, but no single card / node holds it
    CONFLICT = "Conflict"  # commit: the resources were taken since the decision
    QUOTA = "Quota"  # set by the service's quota admission, never by the scheduler core
    # fits only on nodes held for jobs that waited longer (`nomination.py`); they run first
    BLOCKED_BY_NOMINATION = "BlockedByNomination"
    # the job waited long enough to be nominated a node that drains for it (the admission)
    RESERVED = "Reserved"
    # fits on a slower GPU model now, but a faster one is expected to free in time (`delay.py`)
    WAITING_FOR_FASTER_GPU = "WaitingForFasterGpu"


@dataclass(frozen=True, slots=True)
class ClusterReason:
    """One cluster's answer: the code and the numbers behind it (requested vs free vs capacity)."""

    cluster: str
    code: ReasonCode
    message: str
    numbers: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Decision:
    """The scheduler's answer for one request: a placement, or why not per cluster."""

    job_id: str
    placement: Placement | None
    reasons: tuple[ClusterReason, ...] = ()
    policy: str = ""
    score: float | None = None

    @property
    def ok(self) -> bool:
        return self.placement is not None

    @property
    def primary_reason(self) -> ClusterReason | None:
        """The reason of the cluster that came closest, for one-line summaries."""
        return min(self.reasons, key=_reason_rank) if self.reasons else None


# Closeness to fitting: transient causes (a nomination, quota, a lost race) first, then resources
# that free up (fragmented, GPU, memory, CPU), then the structural ones (capacity, labels, nodes).
_RANK = {code: i for i, code in enumerate(reversed(list(ReasonCode)))}


def _reason_rank(reason: ClusterReason) -> int:
    return _RANK[reason.code]
