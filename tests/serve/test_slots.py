import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuplane.serve.slots import SlotRefusal, SlotTable


def table() -> SlotTable:
    return SlotTable([("a", "http://a", 2), ("b", "http://b", 1)])


def test_capacity_is_never_exceeded() -> None:
    t = table()
    t.acquire("a", 0.0)
    t.acquire("a", 0.0)
    assert t.can_acquire("a") is SlotRefusal.FULL
    with pytest.raises(RuntimeError, match="full"):
        t.acquire("a", 0.0)
    assert [i.id for i in t.available()] == ["b"]


def test_release_is_idempotent() -> None:
    t = table()
    lease = t.acquire("b", 0.0)
    assert t.release(lease) is True
    assert t.release(lease) is False
    assert t.get("b").in_flight == 0
    assert t.in_flight == 0


def test_unhealthy_instances_get_no_slot() -> None:
    t = table()
    assert t.set_healthy("a", False) is True
    assert t.set_healthy("a", False) is False
    assert t.can_acquire("a") is SlotRefusal.UNHEALTHY
    assert t.can_acquire("zzz") is SlotRefusal.UNKNOWN_INSTANCE
    assert [i.id for i in t.available()] == ["b"]


def test_expired_leases_are_the_old_ones() -> None:
    t = table()
    old = t.acquire("a", 0.0)
    t.acquire("a", 50.0)
    assert t.expired(now=100.0, ttl=60.0) == [old]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SlotTable([("a", "u", 0)])


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b"]), st.integers(0, 5))))
def test_random_acquire_release_sequences_keep_counts_exact(
    ops: list[tuple[bool, str, int]],
) -> None:
    t = table()
    held = []
    for acquire, iid, pick in ops:
        if acquire and t.can_acquire(iid) is None:
            held.append(t.acquire(iid, 0.0))
        elif held:
            lease = held[pick % len(held)]
            t.release(lease)  # sometimes a second release of the same lease
            if pick % 2:
                held.remove(lease)
        for inst in t.instances:
            assert 0 <= inst.in_flight <= inst.capacity
            assert inst.in_flight == len(inst.leases)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acquire", "release", "health"]),
            st.sampled_from(["a", "b"]),
            st.integers(0, 5),
        )
    )
)
def test_available_follows_every_fill_release_and_health_change(
    ops: list[tuple[str, str, int]],
) -> None:
    t = table()
    held = []
    for op, iid, pick in ops:
        if op == "acquire" and t.can_acquire(iid) is None:
            held.append(t.acquire(iid, 0.0))
        elif op == "release" and held:
            t.release(held.pop(pick % len(held)))
        elif op == "health":
            t.set_healthy(iid, bool(pick % 2))
        expected = [i.id for i in t.instances if i.healthy and i.in_flight < i.capacity]
        assert [i.id for i in t.available()] == expected
