"""Why a job is pending: `PendingReason`, one per cluster, and the one builder of each kind.

The scheduler core says why a request does not fit a cluster's nodes (`ClusterReason`, from its
post-filter); the admission adds its own kinds: quota, a nomination held, a wait for a faster
GPU, a preemption. Every kind is built here, once; `to_json` is how a reason is written, to the
store's `jobs.reasons` and to the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuplane.control.scheduler import ClusterReason, ReasonCode


@dataclass(frozen=True, slots=True)
class PendingReason(ClusterReason):
    """Why a job waits in one cluster: the code, what is short, and the numbers behind it (the
    scheduler's reason, or one of the admission's own kinds)."""

    def to_json(self) -> dict[str, Any]:
        """The reason as the store keeps it and the API shows it (`views.ReasonView`)."""
        return {
            "cluster": self.cluster,
            "code": self.code.value,
            "message": self.message,
            "numbers": dict(self.numbers),
        }


def _reason(
    cluster: str, code: ReasonCode, message: str, numbers: Mapping[str, int] | None = None
) -> PendingReason:
    return PendingReason(cluster, code, message, MappingProxyType(dict(numbers or {})))


def from_scheduler(reasons: Iterable[ClusterReason]) -> tuple[PendingReason, ...]:
    """The scheduler core's reasons (it fits no node of the cluster), numbers as plain ints."""
    return tuple(
        _reason(r.cluster, r.code, r.message, {k: int(v) for k, v in r.numbers.items()})
        for r in reasons
    )


def no_gpu_model(cluster: str) -> PendingReason:
    """The cluster has no GPU of the models the job may use."""
    return _reason(
        cluster, ReasonCode.NO_MATCHING_NODE, "no GPU of the requested models in this cluster"
    )


def quota(cluster: str, refusals: Iterable[str], numbers: Mapping[str, int]) -> PendingReason:
    """The team's quota refuses every GPU model of the cluster the job may use (`refusals`:
    `QuotaDecision.reason` of each)."""
    return _reason(cluster, ReasonCode.QUOTA, "; ".join(refusals), numbers)


def preempted(cluster: str) -> PendingReason:
    """Admitted earlier in the same pass, then preempted by a lending team's job."""
    return _reason(
        cluster,
        ReasonCode.QUOTA,
        "preempted: its team's borrowed quota was reclaimed by the lending team",
    )


def nominated(node: str, cluster: str, waited_s: float, starts_in_s: float | None) -> PendingReason:
    """The job holds a nomination of `node` (`starts_in_s`: when the time limits of the node's
    jobs say it fits, if they bound it)."""
    message = (
        f"holds a nomination on node {node} after waiting {waited_s:.0f} s: "
        "jobs behind it may not take what it needs there, so the node drains for it"
    )
    numbers = {"waited_s": int(waited_s)}
    if starts_in_s is not None:
        numbers["starts_in_s"] = int(starts_in_s)
        message += (
            f"; expected to start within {starts_in_s:.0f} s (the time limits of the "
            "node's jobs), and jobs whose limits end by then may use the node meanwhile"
        )
    return _reason(cluster, ReasonCode.RESERVED, message, numbers)


def waiting_for_faster_gpu(
    cluster: str, slow_model: str, fast_model: str, wait_s: float, loss_s: float
) -> PendingReason:
    """It would run on `slow_model` now, but `fast_model` is expected to free room in time."""
    return _reason(
        cluster,
        ReasonCode.WAITING_FOR_FASTER_GPU,
        f"would run on {slow_model} now, but {fast_model} is expected "
        f"to free room for it in ~{wait_s:.0f} s, sooner than the ~{loss_s:.0f} s "
        f"the slower card would add to a long job",
        {"wait_s": int(wait_s), "loss_s": int(loss_s)},
    )
