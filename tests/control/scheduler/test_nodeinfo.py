"""Where a node's GPU speed comes from (label, table, 1.0) and what a bad one says."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import Request, Snapshot
from gpuplane.errors import ResourceError
from tests.control.scheduler.sched_helpers import decide, mixed, node, with_speed


def test_speed_comes_from_the_label_then_the_table_then_defaults_to_one() -> None:
    snap = Snapshot(
        [
            with_speed(node("labelled", model="A10"), "0.25"),
            node("by-model", model="A10"),
            node("unknown-model", model="T4"),
        ],
        gpu_speeds={"A10": 0.5},
    )
    assert snap.gpu_speed.tolist() == [0.25, 0.5, 1.0]
    assert Snapshot([node("n")]).gpu_speed.tolist() == [1.0]
    assert not snap.gpu_speed.flags.writeable


@pytest.mark.parametrize("bad", ["fast", "0", "-1", "nan", "inf"])
def test_a_bad_speed_label_says_which_node_and_what_is_expected(bad: str) -> None:
    with pytest.raises(ResourceError, match=r"node n1 label gpuplane.io/gpu-speed.*positive"):
        Snapshot([with_speed(node("n1"), bad)])


def test_a_bad_speed_table_names_the_model() -> None:
    with pytest.raises(ResourceError, match=r"gpu_speeds\['A10'\].*positive number"):
        Snapshot([node("n1")], gpu_speeds={"A10": 0.0})


def test_copies_and_new_inventories_keep_the_speeds() -> None:
    snap = mixed()
    assert snap.copy().gpu_speed.tolist() == [0.5, 0.8, 1.0]
    snap.commit(decide(snap, Request("j", gpus=2), "best-fit", speed_weight=1.0).placement)  # type: ignore[arg-type]
    snap.replace_nodes([node("fast", model="A100"), node("other", model="A10")])
    assert snap.gpu_speed.tolist() == [1.0, 0.5]  # the table stays
    assert "j" in snap.allocations
    snap.replace_nodes(snap.nodes, gpu_speeds={"A10": 2.0})
    assert snap.gpu_speed.tolist() == [1.0, 2.0]
