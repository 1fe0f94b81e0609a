"""Usage per team: a slice counts its share of the card, idle apart, reconciled to the cards."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import timeline
from gpuplane.audit.usage import UsageReport, usage
from tests.audit.audit_helpers import CARD, concat, free_card, series

HOUR = 60  # samples, one a minute


def _usage(table: pa.Table, **cfg: object) -> UsageReport:
    window, _ = timeline(table)
    return usage(table, window, AuditSettings.model_validate(cfg))


def test_four_quarter_slices_on_one_card_for_an_hour_are_one_gpu_hour() -> None:
    quarters = concat(
        *(series(f"q{i}", [1000.0] * HOUR, [0.2] * HOUR, team=f"team{i % 2}",
                 alloc_mem=CARD // 4, alloc_cores=25) for i in range(4))
    )  # fmt: skip
    u = _usage(quarters, prices={"A100-80GB": 2.0})
    assert u.allocated_gpu_hours == pytest.approx(1.0)
    assert u.physical_gpu_hours == pytest.approx(1.0)
    assert u.free_gpu_hours == pytest.approx(0.0)
    assert u.reconciled
    by_team = {t.team: t for t in u.teams}
    assert by_team["team0"].gpu_hours == pytest.approx(0.5)
    assert by_team["team0"].slice_hours == pytest.approx(4.0)  # 2 x 2/8 of a card for an hour
    assert by_team["team0"].cost == pytest.approx(1.0)
    assert by_team["team0"].used_gpu_hours == pytest.approx(0.4)


def test_idle_and_free_are_shown_apart_and_unpriced_models_are_named() -> None:
    table = concat(
        series("busy", [1000.0] * HOUR, [0.5] * HOUR, card="n0/0"),
        series("held", [1000.0] * HOUR, [0.0] * HOUR, card="n0/1"),
        free_card(HOUR, card="n0/2"),
    )
    u = _usage(table)
    t = u.teams[0]
    assert t.gpu_hours == pytest.approx(2.0)
    assert t.idle_gpu_hours == pytest.approx(1.0)
    assert u.free_gpu_hours == pytest.approx(1.0)
    assert u.physical_gpu_hours == pytest.approx(3.0)
    assert u.reconciled
    assert t.cost is None
    assert u.unpriced == ("A100-80GB",)


def test_missing_samples_break_the_reconciliation() -> None:
    table = concat(
        series("a", [1000.0] * HOUR, [0.5] * HOUR, card="n0/0"),
        series("b", [1000.0] * (HOUR // 2), [0.5] * (HOUR // 2), card="n0/1"),  # collector down
    )
    u = _usage(table)
    assert u.gap == pytest.approx(0.25)
    assert not u.reconciled
