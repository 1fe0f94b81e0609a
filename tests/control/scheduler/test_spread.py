"""The score phase's spread preference on hand-made snapshots: a spread group's requests go to
different clusters first, then different nodes, whatever the policy; a full failure domain
never keeps one unplaced; releases and copies keep the counts."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import Request, Snapshot
from tests.control.scheduler.sched_helpers import node, place

POLICIES = ["frag", "fgd", "best-fit", "binpack", "spread", "packing"]


def estate() -> Snapshot:
    """Cluster east of two nodes, cluster west of one; two cards each."""
    return Snapshot(
        [
            node("e0", cards=2, cluster="east"),
            node("e1", cards=2, cluster="east"),
            node("w0", cards=2, cluster="west"),
        ]
    )


def replica(i: int, group: str | None = "research/deployment/chat/v1") -> Request:
    return Request(f"chat-{i}", gpus=1, spread=group)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_groups_requests_go_to_another_cluster_then_another_node(policy: str) -> None:
    snap = estate()
    clusters = [place(snap, replica(i), policy).placement for i in range(3)]
    assert all(p is not None for p in clusters)
    # two on different clusters, and the third on the node of the two-node cluster that has none
    assert {p.cluster for p in clusters[:2]} == {"east", "west"}  # type: ignore[union-attr]
    assert len({p.node for p in clusters}) == 3  # type: ignore[union-attr]


@pytest.mark.parametrize("policy", ["binpack", "best-fit", "frag"])
def test_without_a_group_packing_policies_stack_them(policy: str) -> None:
    """The reason the preference exists: a packing policy puts both replicas on one node."""
    snap = estate()
    nodes = {place(snap, replica(i, None), policy).placement.node for i in range(2)}  # type: ignore[union-attr]
    assert len(nodes) == 1


def test_another_group_does_not_count() -> None:
    snap = estate()
    place(snap, Request("other-0", gpus=1, spread="research/deployment/other/v1"), "binpack")
    place(snap, Request("plain", gpus=1), "binpack")
    on_cluster, on_node = snap.spread_counts(replica(0).spread or "")
    assert int(on_cluster.sum()) == 0
    assert int(on_node.sum()) == 0
    assert snap.spread_counts("research/deployment/other/v1")[1].sum() == 1


def test_a_full_cluster_does_not_keep_a_replica_unplaced() -> None:
    snap = estate()
    assert place(snap, Request("fill", gpus=2), "binpack").placement.node == "w0"  # type: ignore[union-attr]
    placed = [place(snap, replica(i), "binpack").placement for i in range(4)]
    assert all(p is not None and p.cluster == "east" for p in placed)
    # and across east's nodes, two each
    assert sorted(p.node for p in placed) == ["e0", "e0", "e1", "e1"]  # type: ignore[union-attr]


def test_a_release_frees_the_domain_and_a_copy_counts_apart() -> None:
    snap = estate()
    first = place(snap, replica(0), "binpack").placement
    assert first is not None
    trial = snap.copy()
    place(trial, replica(1), "binpack")
    assert "chat-1" not in snap.allocations
    assert snap.release("chat-0") == first
    assert snap.release("chat-0") is None  # idempotent, and the count does not go below 0
    again = place(snap, replica(2), "binpack").placement
    assert again is not None
    on_cluster, on_node = snap.spread_counts(replica(0).spread or "")
    assert int(on_cluster.sum()) == 1
    assert int(on_node.sum()) == 1


def test_a_rebuilt_snapshot_counts_the_committed_placements() -> None:
    """The service rebuilds its snapshot from the store (`inventory.py`): the placements it
    gives back carry their group, so a restart keeps spreading."""
    snap = estate()
    first = place(snap, replica(0), "binpack").placement
    assert first is not None
    rebuilt = Snapshot(snap.nodes, [first])
    assert place(rebuilt, replica(1), "binpack").placement.cluster != first.cluster  # type: ignore[union-attr]
