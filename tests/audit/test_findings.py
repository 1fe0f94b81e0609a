"""Findings on small recorded estates: each class flags what it names and leaves the rest."""

from __future__ import annotations

import pyarrow as pa
import pytest

from gpuplane.audit.findings import FindingKind
from gpuplane.audit.fleet import Fleet, generate
from gpuplane.audit.pipeline import Audit, run_audit
from gpuplane.audit.settings import AuditSettings
from tests.audit.audit_helpers import CARD, concat, free_card, series, traffic

N = 180  # three hours of 1-minute samples
GIB = 1024


def _flags(samples: pa.Table, tr: pa.Table | None = None, **cfg: object) -> dict[str, set[str]]:
    audit = run_audit(samples, tr, AuditSettings.model_validate(cfg))
    out: dict[str, set[str]] = {}
    for f in audit.findings:
        out.setdefault(f.subject, set()).add(str(f.kind))
    return out


def test_idle_needs_no_compute_for_the_whole_idle_window_at_the_end() -> None:
    busy_then_idle = [0.3] * (N - 60) + [0.0] * 60
    briefly_idle = [0.3] * (N - 20) + [0.0] * 20
    flags = _flags(
        concat(
            series("stopped", [8 * GIB] * N, busy_then_idle, card="n0/0"),
            series("pausing", [8 * GIB] * N, briefly_idle, card="n0/1"),
            series("busy", [8 * GIB] * N, [0.3] * N, card="n0/2"),
        )
    )
    assert "idle" in flags["stopped"]
    assert "idle" not in flags.get("pausing", set())
    assert "idle" not in flags.get("busy", set())
    assert "idle_held" not in flags["stopped"]  # it computed earlier in the window


def test_idle_held_is_memory_held_with_no_compute_all_window() -> None:
    flags = _flags(
        concat(
            series("loaded", [4 * GIB] * N, [0.0] * N, card="n0/0"),
            series("empty", [300.0] * N, [0.0] * N, card="n0/1"),
        )
    )
    assert {"idle", "idle_held"} <= flags["loaded"]
    assert "idle_held" not in flags["empty"]  # 300 MiB is below held_mem_mib
    assert (
        "idle_held"
        not in _flags(series("loaded", [4 * GIB] * N, [0.0] * N), held_mem_mib=8192)["loaded"]
    )


def test_oversized_memory_and_compute_against_the_allocation() -> None:
    flags = _flags(
        concat(
            series("small", [8 * GIB] * N, [0.5] * N, card="n0/0"),
            series("heavy", [70 * GIB] * N, [0.9] * N, card="n0/1"),
            series(
                "slice", [8 * GIB] * N, [0.05] * N, card="n0/2", alloc_mem=10 * GIB, alloc_cores=25
            ),
        )
    )
    assert "oversized_memory" in flags["small"]  # 8 GiB x 1.2 -> 10 GiB of 80
    assert "oversized_compute" not in flags["small"]  # p95 0.5 is not under half the card
    assert flags.get("heavy", set()) == set()
    # a 10 GiB slice holding 8 GiB has no slice step to give back; 5 % of 25 % is oversized
    assert flags["slice"] == {"oversized_compute"}


def test_zero_traffic_is_a_deployment_none_of_whose_instances_served() -> None:
    samples = concat(
        series("dead-0", [4 * GIB] * N, [0.2] * N, card="n0/0"),
        series("live-0", [4 * GIB] * N, [0.2] * N, card="n0/1"),
        series("live-1", [4 * GIB] * N, [0.2] * N, card="n0/2"),
    )
    tr = concat(
        traffic("http://dead-0:8000", "dead", [0] * N),
        traffic("http://live-0:8000", "live", [3] * N),
        traffic("http://live-1:8000", "live", [0] * N),  # the router sent it nothing
    )
    flags = _flags(samples, tr)
    assert "zero_traffic" in flags["dead-0"]
    assert "zero_traffic" not in flags.get("live-0", set()) | flags.get("live-1", set())
    without = _flags(samples)  # no traffic read: not evaluated, never guessed
    assert all("zero_traffic" not in v for v in without.values())


def test_fragmented_node_is_one_whose_free_remnants_no_common_shape_uses() -> None:
    tables = [
        series(f"job-{i}", [10 * GIB] * N, [0.5] * N, node="n1", card=f"n1/{i}", kind="batch",
               alloc_mem=CARD * 85 // 100, alloc_cores=85)
        for i in range(4)
    ]  # fmt: skip
    tables += [series(f"svc-{i}", [10 * GIB] * N, [0.5] * N, node="n0", card=f"n0/{i}")
               for i in range(4)]  # fmt: skip
    tables.append(free_card(N, node="n2", card="n2/0"))
    flags = _flags(concat(*tables))
    assert flags.get("n1") == {"fragmented"}
    assert "n0" not in flags
    assert "n2" not in flags


@pytest.fixture(scope="module")
def seed_fleet() -> tuple[Fleet, Audit]:
    fleet = generate(3)
    return fleet, run_audit(fleet.samples(), fleet.traffic())


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FindingKind))
def test_every_finding_class_is_found_on_the_seed_fleet(
    seed_fleet: tuple[Fleet, Audit], kind: FindingKind
) -> None:
    fleet, audit = seed_fleet
    truth = {n for n, c in fleet.truth(audit.settings).items() if kind in c}
    found = {f.subject for f in audit.findings if f.kind is kind}
    assert truth
    assert found
    assert len(found & truth) / len(found) >= 0.95  # precision
    assert len(found & truth) / len(truth) >= 0.90  # recall
