"""Pending reasons: one typed kind per cause, written one way to the store and the API."""

from __future__ import annotations

from types import MappingProxyType

from gpuplane.control.admission import PendingReason, from_scheduler
from gpuplane.control.scheduler import ClusterReason, ReasonCode
from gpuplane.control.store.views import ReasonView


def test_a_reason_is_written_as_the_api_shows_it() -> None:
    (reason,) = from_scheduler(
        [
            ClusterReason(
                "east",
                ReasonCode.INSUFFICIENT_GPUS,
                "2 wholly free cards, 4 requested",
                MappingProxyType({"requested": 4, "free": 2}),
            )
        ]
    )
    assert isinstance(reason, PendingReason)
    assert reason.code == ReasonCode.INSUFFICIENT_GPUS
    written = reason.to_json()
    assert written == {
        "cluster": "east",
        "code": "InsufficientGpus",
        "message": "2 wholly free cards, 4 requested",
        "numbers": {"requested": 4, "free": 2},
    }
    assert ReasonView(**written).model_dump() == written
