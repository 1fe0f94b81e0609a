"""Writing an adapter's inventory into the store, on a real SQLite store: in full
(`sync_cluster`, at registration and after a relist) and only the nodes a watch changed
(`sync_nodes`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import selectinload

from gpuplane.control.adapters import DiscoveredDevice, DiscoveredNode, Inventory, InventoryChange
from gpuplane.control.service.inventory import sync_cluster, sync_nodes
from gpuplane.control.store.models import Allocation, Device, Job, Node, Team
from gpuplane.control.store.store import Store
from gpuplane.resources import LABEL_CLUSTER


def node(name: str, *cards: int, cpu_millis: int = 8000) -> DiscoveredNode:
    devices = tuple(DiscoveredDevice(i, "L4", 24576, f"GPU-{name}-{i}") for i in cards)
    return DiscoveredNode(name, cpu_millis, 1024, {"pool": "p1"}, devices)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path}/control.db")
    yield s
    s.close()


def rows(store: Store) -> dict[str, tuple[int, list[int]]]:
    """Each node of cluster c: its CPU and its cards' indexes."""
    with store.session() as session:
        nodes = session.scalars(
            select(Node).where(Node.cluster_name == "c").options(selectinload(Node.devices))
        )
        return {n.name: (n.cpu_millis, [d.index for d in n.devices]) for n in nodes}


def hold(store: Store, node_name: str, index: int) -> None:
    """A running job holds card `index` of `node_name`."""
    with store.session() as session, session.begin():
        device = session.scalars(
            select(Device).join(Node).where(Node.name == node_name, Device.index == index)
        ).one()
        session.add(Team(name="t"))
        session.flush()
        session.add(Job(id="j", name="j", team_name="t", state="running", spec={}, created_at=0))
        session.flush()
        session.add(Allocation(job_id="j", device_id=device.id, mem_mib=1024, gpu_milli=250))


def test_a_watch_change_writes_only_the_nodes_it_names(store: Store) -> None:
    full = Inventory((node("a", 0, 1), node("b", 0, 1), node("c", 0, 1), node("e", 0)), "test")
    with store.session() as session, session.begin():
        sync_cluster(session, "c", "kubernetes", {}, "eu", full, 0.0)
    hold(store, "b", 1)
    with store.session() as session, session.begin():  # marks c: a rewrite would undo it
        session.execute(update(Node).where(Node.name == "c").values(cpu_millis=1))
    change = InventoryChange(
        nodes=(node("a", 0, cpu_millis=4000), node("d", 0, 1)), gone=("b", "e")
    )
    with store.session() as session, session.begin():
        sync_nodes(session, "c", change)
    assert rows(store) == {
        "a": (4000, [0]),  # changed: its card 1 left (unhealthy)
        "b": (8000, [0, 1]),  # gone, but a job still holds its card 1: kept
        "c": (1, [0, 1]),  # not in the change: not written
        "d": (8000, [0, 1]),  # new
    }
    with store.session() as session:
        d = session.scalars(select(Node).where(Node.name == "d")).one()
        assert d.labels[LABEL_CLUSTER] == "c"  # the cluster's labels, as a full sync gives
        assert d.labels["pool"] == "p1"


def test_a_change_to_a_cluster_never_synced_in_full_is_refused(store: Store) -> None:
    with (
        store.session() as session,
        session.begin(),
        pytest.raises(LookupError, match="sync it in full first"),
    ):
        sync_nodes(session, "nowhere", InventoryChange(nodes=(node("a", 0),)))
