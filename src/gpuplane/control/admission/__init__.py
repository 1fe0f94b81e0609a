"""The admission cycle, pure (no SQL, no clock, no I/O): who is admitted where, and why not.

One pass (`cycle.run_pass`) over an `Estate`: queue sort (`order.py`), quota check
(`flavors.py`), filter and score through the scheduler core (`placement.py`), wait for a faster
GPU or on a nominated node (`delay.py`, `nominate.py`), reclaim (`reclaim.py`), then reserve and
commit (`commit.py`), or the typed pending reasons (`reasons.py`). Ask, then commit:
`can_admit` answers an `AdmissionDecision` that carries its reasons; `admit` applies it.
"""

from gpuplane.control.admission.commit import admit
from gpuplane.control.admission.cycle import can_admit, run_pass
from gpuplane.control.admission.decision import (
    AdmissionDecision,
    Admitted,
    NominationPolicy,
    PassResult,
    PendingJob,
)
from gpuplane.control.admission.delay import MIN_WORK_SAMPLES, FasterGpu, FasterGpuWait, WorkHistory
from gpuplane.control.admission.estate import Estate, Running
from gpuplane.control.admission.order import AdmissionQueue
from gpuplane.control.admission.reasons import PendingReason, from_scheduler
from gpuplane.control.admission.reclaim import reclaim_candidates

__all__ = [
    "MIN_WORK_SAMPLES",
    "AdmissionDecision",
    "AdmissionQueue",
    "Admitted",
    "Estate",
    "FasterGpu",
    "FasterGpuWait",
    "NominationPolicy",
    "PassResult",
    "PendingJob",
    "PendingReason",
    "Running",
    "WorkHistory",
    "admit",
    "can_admit",
    "from_scheduler",
    "reclaim_candidates",
    "run_pass",
]
