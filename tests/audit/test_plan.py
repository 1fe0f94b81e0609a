"""The re-pack plan through the scheduler core: cards freed, nothing over-booked, undone drains,
moves by savings, retirements, and an id that names its inputs."""

from __future__ import annotations

import pyarrow as pa

from gpuplane.audit.estate import AuditEstate, Held
from gpuplane.audit.pipeline import Audit, run_audit
from gpuplane.audit.plan import violations
from gpuplane.audit.settings import AuditSettings
from tests.audit.audit_helpers import CARD, concat, series, traffic

GIB = 1024
N = 120


def _estate(extra_mem: float = 4 * GIB) -> pa.Table:
    """n0: four small services; n1: a heavy one and three small ones."""
    tables = [series(f"s{i}", [extra_mem] * N, [0.04] * N, node="n0", card=f"n0/{i}")
              for i in range(4)]  # fmt: skip
    tables.append(series("heavy", [70 * GIB] * N, [0.9] * N, node="n1", card="n1/0"))
    tables += [series(f"t{i}", [4 * GIB] * N, [0.04] * N, node="n1", card=f"n1/{i}")
               for i in range(1, 4)]  # fmt: skip
    return concat(*tables)


def _audit(samples: pa.Table, tr: pa.Table | None = None, **cfg: object) -> Audit:
    return run_audit(samples, tr, AuditSettings.model_validate(cfg))


def test_small_services_are_packed_onto_few_cards_without_over_booking() -> None:
    plan = _audit(_estate()).plan
    assert plan.held_before == 8
    assert plan.held_after == 2  # the heavy card, and one card holding the seven small ones
    assert plan.freed == 6
    assert plan.violations == 0
    moves = [m for m in plan.moves if m.action == "move"]
    assert len({m.workload for m in moves}) == len(moves)  # each moves at most once
    assert "heavy" not in {m.workload for m in moves}  # moving a whole card frees nothing
    assert [m.saving for m in moves] == sorted((m.saving for m in moves), reverse=True)
    targets = {m.to_card for m in moves}
    assert not targets & {m.from_card for m in moves}  # nothing lands on a card being drained


def test_a_drain_that_does_not_fit_is_undone() -> None:
    # two services that each need 50 GiB: no card holds both, so both stay where they are
    samples = concat(
        series("a", [35 * GIB] * N, [0.3] * N, card="n0/0"),
        series("b", [35 * GIB] * N, [0.3] * N, card="n0/1"),
    )
    plan = _audit(samples).plan
    assert plan.freed == 0
    assert plan.violations == 0
    assert {m.action for m in plan.moves} == {"resize"}
    assert plan.after == {"n0/0": ("a",), "n0/1": ("b",)}


def test_dead_deployments_are_retired_first_unless_told_not_to() -> None:
    samples = concat(_estate(), series("dead-0", [4 * GIB] * N, [0.0] * N, node="n2",
                                       card="n2/0"))  # fmt: skip
    tr = concat(traffic("http://dead-0:8000", "dead", [0] * N),
                *(traffic(f"http://s{i}:8000", "s", [5] * N) for i in range(4)))  # fmt: skip
    plan = _audit(samples, tr).plan
    assert plan.moves[0].action == "retire"
    assert plan.moves[0].workload == "dead-0"
    assert "n2/0" not in plan.after
    kept = _audit(samples, tr, retire_dead=False).plan
    assert "retire" not in {m.action for m in kept.moves}


def test_the_plan_id_is_a_digest_of_its_inputs() -> None:
    first, again = _audit(_estate()).plan, _audit(_estate()).plan
    assert first.id == again.id
    assert first.moves == again.moves
    assert _audit(_estate(extra_mem=12 * GIB)).plan.id != first.id  # new sizes
    assert _audit(_estate(), headroom=1.5).plan.id != first.id  # new settings


def test_violations_counts_what_the_core_refuses() -> None:
    plan_estate = AuditEstate.of(_audit(_estate()).stats.cards)
    fits = [
        Held("a", "c", "n0", "n0/0", 40 * GIB, 500),
        Held("b", "c", "n0", "n0/0", 40 * GIB, 500),
    ]
    assert violations(plan_estate, fits) == 0
    over = [*fits, Held("x", "c", "n0", "n0/0", 10 * GIB, 100)]
    assert violations(plan_estate, over) == 1
    wrong_model = [Held("y", "c", "n0", "n0/1", CARD, 1000, "H100")]
    assert violations(plan_estate, wrong_model) == 1
