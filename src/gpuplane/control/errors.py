"""The control plane's errors, mapped to HTTP once, in `api.py` (404, 409, 422)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuplane.control.admission import PendingReason
from gpuplane.errors import GpuplaneError


class NotFoundError(GpuplaneError):
    """No job, cluster or team by that name."""


class ConflictError(GpuplaneError):
    """The object is not in a state that allows the operation."""


class InfeasibleJobError(GpuplaneError):
    """The job can never run on this estate (e.g. 200 GiB on 80 GiB cards, unknown GPU model)."""

    def __init__(self, message: str, reasons: Sequence[PendingReason]) -> None:
        super().__init__(message)
        self.reasons = tuple(reasons)
