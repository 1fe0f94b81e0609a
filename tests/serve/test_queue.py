from collections import Counter

import pytest

from gpuplane.serve.queue import LOOKAHEAD, FairQueue


def drain(q: FairQueue[str]) -> list[str]:
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


def test_fifo_within_a_tenant() -> None:
    q: FairQueue[str] = FairQueue(10)
    for i in range(3):
        q.push(f"a{i}", "a")
    assert drain(q) == ["a0", "a1", "a2"]


def test_tenants_alternate_at_equal_weight() -> None:
    q: FairQueue[str] = FairQueue(100)
    for i in range(4):
        q.push(f"a{i}", "a")
    for i in range(4):
        q.push(f"b{i}", "b")
    assert drain(q) == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_weights_share_turns_in_proportion() -> None:
    q: FairQueue[str] = FairQueue(100)
    for i in range(30):
        q.push(f"a{i}", "a", weight=2.0)
        q.push(f"b{i}", "b", weight=1.0)
    first = [q.pop() for _ in range(30)]
    counts = Counter(x[0] for x in first if x)
    assert counts == {"a": 20, "b": 10}


def test_priority_goes_first() -> None:
    q: FairQueue[str] = FairQueue(10)
    q.push("low", "a", priority=0)
    q.push("high", "b", priority=5)
    assert drain(q) == ["high", "low"]


def test_idle_tenant_earns_no_credit() -> None:
    q: FairQueue[str] = FairQueue(100)
    for i in range(10):
        q.push(f"a{i}", "a")
    for _ in range(6):
        q.pop()
    q.push("b0", "b")
    q.push("b1", "b")
    # b arrives late: it alternates with a from now on instead of draining first
    assert drain(q) == ["b0", "a6", "b1", "a7", "a8", "a9"]


def test_bounded_and_removal() -> None:
    q: FairQueue[str] = FairQueue(2)
    t1 = q.push("x", "a")
    q.push("y", "a")
    assert q.is_full()
    with pytest.raises(OverflowError):
        q.push("z", "a")
    assert q.remove(t1) is True
    assert q.remove(t1) is False
    assert len(q) == 1
    assert q.depth_by_tenant() == {"a": 1}
    assert drain(q) == ["y"]


def test_prefer_bends_fairness_only_within_the_slack() -> None:
    q: FairQueue[str] = FairQueue(100, slack=1.0)
    for i in range(3):
        q.push(f"a{i}", "a")
        q.push(f"b{i}", "b")
    # b's requests are preferred, but b may run at most `slack` turns ahead of a
    order = [q.pop(prefer=lambda item: 1.0 if item.startswith("b") else 0.0) for _ in range(6)]
    assert order == ["b0", "b1", "a0", "b2", "a1", "a2"]


def hit(item: str) -> float:
    return 1.0 if item.startswith("hit") else 0.0


def test_prefer_bends_a_tenants_fifo_past_each_item_at_most_max_passes_times() -> None:
    q: FairQueue[str] = FairQueue(100, max_passes=2)
    for name in ("a0", "a1", "hit2", "hit3", "hit4"):
        q.push(name, "a")
    assert q.pop(prefer=hit) == "hit2"
    assert q.pop(prefer=hit) == "hit3"
    # a0 and a1 were passed over twice: hit4 may not go before them
    assert [q.pop(prefer=hit) for _ in range(3)] == ["a0", "a1", "hit4"]


def test_a_preferred_head_or_no_max_passes_keeps_fifo() -> None:
    strict: FairQueue[str] = FairQueue(100)
    for name in ("a0", "hit1"):
        strict.push(name, "a")
    assert strict.pop(prefer=hit) == "a0"  # max_passes 0: FIFO within a tenant
    q: FairQueue[str] = FairQueue(100, max_passes=1)
    for name in ("hit0", "a1", "hit2"):
        q.push(name, "a")
    assert q.pop(prefer=hit) == "hit0"  # the head scores as high: no one is passed over
    assert q.pop(prefer=hit) == "hit2"
    assert q.pop(prefer=hit) == "a1"


def test_bending_looks_only_lookahead_items_into_a_tenants_fifo() -> None:
    q: FairQueue[str] = FairQueue(100, max_passes=1)
    for i in range(LOOKAHEAD):
        q.push(f"a{i}", "a")
    q.push("hit", "a")
    assert q.pop(prefer=hit) == "a0"


def test_position_counts_earlier_and_higher_priority() -> None:
    q: FairQueue[str] = FairQueue(10)
    q.push("a0", "a")
    t = q.push("b0", "b")
    q.push("hi", "c", priority=1)
    assert q.position(t) == 2


def test_an_item_that_may_not_go_yet_keeps_its_place_without_blocking_its_tenant() -> None:
    q: FairQueue[str] = FairQueue(10)
    for name in ("waits-for-holder", "a1", "a2"):
        q.push(name, "a")
    held = {"waits-for-holder"}
    assert q.pop(eligible=lambda item: item not in held) == "a1"
    held.clear()  # its holder freed a slot: it goes before the later a2
    assert drain(q) == ["waits-for-holder", "a2"]
    assert len(q) == 0
