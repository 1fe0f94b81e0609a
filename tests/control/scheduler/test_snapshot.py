"""Snapshot: ask-then-commit, idempotent release, copies, inventory changes."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import (
    DeviceGrant,
    Placement,
    ReasonCode,
    SchedulingConflict,
    Snapshot,
)
from gpuplane.errors import ResourceError
from tests.control.scheduler.sched_helpers import GIB, node


def share(job: str, card: int, gib: int, milli: int, on: str = "n1") -> Placement:
    return Placement(job, "c1", on, (DeviceGrant(card, gib * GIB, milli),), 1000, GIB)


def test_commit_updates_free_resources_and_aggregates() -> None:
    snap = Snapshot([node("n1", cards=2)])
    assert snap.full_free.tolist() == [2]
    snap.commit(share("a", 0, 20, 250))
    assert snap.dev_milli_free[0].tolist() == [750, 1000]
    assert snap.dev_mem_free[0, 0] == 60 * GIB
    assert snap.full_free.tolist() == [1]
    assert snap.max_milli_free.tolist() == [1000]
    assert snap.cpu_free[0] == 63_000
    assert "a" in snap.allocations


def test_check_refuses_a_placement_that_no_longer_fits_and_commit_raises() -> None:
    snap = Snapshot([node("n1", cards=1)])
    snap.commit(share("a", 0, 60, 500))
    late = share("b", 0, 30, 250)  # 30 GiB on a card with 20 GiB left
    reason = snap.check(late)
    assert reason is not None
    assert reason.code is ReasonCode.CONFLICT
    assert reason.numbers["mem_free"] == 20 * GIB
    with pytest.raises(SchedulingConflict):
        snap.commit(late)
    assert snap.dev_mem_free[0, 0] == 20 * GIB  # nothing applied


def test_a_job_cannot_hold_two_allocations() -> None:
    snap = Snapshot([node("n1")])
    snap.commit(share("a", 0, 10, 100))
    with pytest.raises(SchedulingConflict, match="already holds"):
        snap.commit(share("a", 1, 10, 100))


@pytest.mark.parametrize(
    "placement",
    [
        Placement("x", "c1", "nope", (), 0, 0),
        Placement("x", "c2", "n1", (), 0, 0),
        Placement("x", "c1", "n1", (DeviceGrant(9, 1, 1),), 0, 0),
        Placement("x", "c1", "n1", (DeviceGrant(0, 1, 1), DeviceGrant(0, 1, 1)), 0, 0),
        Placement("x", "c1", "n1", (DeviceGrant(0, 80 * GIB, 1000), DeviceGrant(1, GIB, 10)), 0, 0),
        Placement("x", "c1", "n1", (), 10**9, 0),
    ],
    ids=[
        "unknown-node",
        "wrong-cluster",
        "no-such-card",
        "same-card-twice",
        "partial-multi",
        "cpu",
    ],
)
def test_check_rejects_malformed_or_oversized_placements(placement: Placement) -> None:
    assert Snapshot([node("n1", cards=2)]).check(placement) is not None


def test_release_is_idempotent_and_restores_everything() -> None:
    snap = Snapshot([node("n1", cards=2)])
    before = (snap.dev_milli_free.copy(), snap.dev_mem_free.copy(), snap.cpu_free.copy())
    snap.commit(share("a", 1, 40, 500))
    assert snap.release("a") is not None
    assert snap.release("a") is None
    assert snap.release("never-seen") is None
    assert (snap.dev_milli_free == before[0]).all()
    assert (snap.dev_mem_free == before[1]).all()
    assert (snap.cpu_free == before[2]).all()
    assert snap.full_free.tolist() == [2]


def test_copy_is_independent_and_versions_track_changes() -> None:
    snap = Snapshot([node("n1"), node("n2")])
    version = snap.node_version.copy()
    other = snap.copy()
    other.commit(share("a", 0, 10, 100))
    assert snap.dev_milli_free[0, 0] == 1000
    assert "a" not in snap.allocations
    assert snap.placements_on("n1") == []
    assert [p.job_id for p in other.placements_on("n1")] == ["a"]
    assert other.token is not snap.token
    assert other.node_version[0] > version[0]
    assert other.node_version[1] == version[1]


def test_allocations_are_restored_at_construction() -> None:
    snap = Snapshot([node("n1", cards=1)], allocations=[share("a", 0, 40, 500)])
    assert snap.dev_milli_free[0, 0] == 500
    with pytest.raises(SchedulingConflict):
        Snapshot([node("n1", cards=1)], [share("a", 0, 60, 600), share("b", 0, 60, 600)])


def test_replace_nodes_keeps_the_allocations_that_still_fit() -> None:
    snap = Snapshot([node("n1", cards=2), node("n2", cards=2)])
    snap.commit(share("a", 1, 10, 100, on="n1"))
    snap.commit(share("b", 1, 10, 100, on="n2"))
    dropped = snap.replace_nodes([node("n1", cards=2), node("n2", cards=1)])
    assert [p.job_id for p in dropped] == ["b"]
    assert set(snap.allocations) == {"a"}
    assert [p.job_id for p in snap.placements_on("n1")] == ["a"]
    assert snap.placements_on("n2") == []


def test_cordoned_nodes_keep_their_allocations() -> None:
    snap = Snapshot([node("n1")])
    snap.commit(share("a", 0, 10, 100))
    snap.set_schedulable("n1", False)
    assert not snap.schedulable[0]
    assert "a" in snap.allocations


def test_inventory_must_be_well_formed() -> None:
    with pytest.raises(ResourceError, match="unique"):
        Snapshot([node("n1"), node("n1")])
