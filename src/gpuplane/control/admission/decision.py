"""What the admission cycle takes and answers: pending jobs, the ask's decision, a pass's result."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuplane.control.admission.quota import Amount
from gpuplane.control.admission.reasons import PendingReason
from gpuplane.control.scheduler import Placement, Request


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    team: str
    priority: int
    created_at: float
    request: Request


@dataclass(frozen=True, slots=True)
class NominationPolicy:
    """When a waiting job is nominated a node: once it has waited `after_s` seconds (since
    submit) without fitting; at most `limit` at a time, in queue order (0: never)."""

    after_s: float
    limit: int


@dataclass(frozen=True, slots=True)
class Admitted:
    job_id: str
    placement: Placement
    flavor: str | None
    amount: Amount
    preempted: tuple[str, ...] = ()


@dataclass(slots=True)  # not frozen: one per job per pass, and frozen ones cost twice to build
class AdmissionDecision:
    """The answer of `can_admit` for one job: admitted (where, on which flavor, preempting whom;
    `admit` commits it), or the reasons per cluster. `eligible`: the request as its quota
    allows it (None when quota allows no GPU model), what a nomination would hold; `waits`: it
    waits for a faster GPU model (the pass remembers since when)."""

    admitted: Admitted | None = None
    reasons: tuple[PendingReason, ...] = ()
    eligible: Request | None = None
    waits: bool = False


@dataclass(slots=True)
class PassResult:
    admitted: list[Admitted] = field(default_factory=list)
    reasons: dict[str, tuple[PendingReason, ...]] = field(default_factory=dict)
    # admitted earlier in this pass, then preempted by a later job: pending, not re-evaluated
    requeued: list[str] = field(default_factory=list)
