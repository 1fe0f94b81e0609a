"""The deployment reconciler's pure core: starts, drains, stops and back-off, on given times."""

from __future__ import annotations

from gpuplane.control.deployments.reconcile import Instance, Want, plan

V1 = Want({"v1": 2}, drain_timeout_s=30.0)


def inst(
    job_id: str,
    state: str = "running",
    version: str = "v1",
    created: float = 0.0,
    draining: float | None = None,
) -> Instance:
    return Instance(job_id, version, state, created, draining)


def test_missing_instances_are_started() -> None:
    assert plan(V1, [], now=0.0).start == {"v1": 2}
    assert plan(V1, [inst("a")], now=0.0).start == {"v1": 1}
    assert not plan(V1, [inst("a"), inst("b", "pending")], now=0.0).changes


def test_surplus_drains_not_yet_running_first_then_the_newest() -> None:
    one = Want({"v1": 1}, 30.0)
    todo = plan(
        one, [inst("old", created=1), inst("new", created=2), inst("p", "pending", created=0)], 5.0
    )
    assert todo.drain == ["p", "new"]
    assert todo.stop == ["p"]  # it never took a request: stopped at once
    assert todo.start == {}


def test_surplus_drains_from_the_most_crowded_cluster_before_the_newest() -> None:
    """Scaling 3 down to 2 (or ending a move) keeps the instances spread: the one to go is on
    the cluster holding two, though the newest is alone on its own."""
    two = Want({"v1": 2}, 30.0)
    seen = [
        Instance("w1", "v1", "running", 1.0, cluster="west"),
        Instance("w2", "v1", "running", 2.0, cluster="west"),
        Instance("e1", "v1", "running", 3.0, cluster="east"),
    ]
    assert plan(two, seen, 5.0).drain == ["w2"]


def test_surplus_drains_an_idle_instance_before_a_busy_newer_one() -> None:
    """Scaling 3 down to 2 on one cluster: the instance no gateway holds a slot on goes, so its
    drain ends at once, though it is not the newest; with no reports, the newest."""
    two = Want({"v1": 2}, 30.0)
    seen = [inst("a", created=1), inst("idle", created=2), inst("busy", created=3)]
    assert plan(two, seen, 5.0, held={"a": 1, "busy": 2}).drain == ["idle"]
    assert plan(two, seen, 5.0).drain == ["busy"]


def test_a_draining_instance_stops_after_the_drain_timeout() -> None:
    zero = Want({"v1": 0}, 30.0)
    assert plan(zero, [inst("a", draining=10.0)], now=39.9).stop == []
    assert plan(zero, [inst("a", draining=10.0)], now=40.0).stop == ["a"]


def test_a_crash_is_reported_and_its_replacement_waits_for_the_back_off() -> None:
    todo = plan(V1, [inst("a"), inst("b", "failed")], now=10.0)
    assert todo.forget == ["b"]
    assert [i.job_id for i in todo.crashed] == ["b"]
    assert todo.start == {}  # the caller counts the crash first
    waiting = plan(V1, [inst("a")], now=10.5, next_start={"v1": 12.0})
    assert waiting.start == {}
    assert waiting.waiting_until == 12.0
    assert plan(V1, [inst("a")], now=12.0, next_start={"v1": 12.0}).start == {"v1": 1}


def test_an_instance_stopped_while_draining_is_not_a_crash() -> None:
    todo = plan(Want({"v1": 0}, 30.0), [inst("a", "cancelled", draining=1.0)], now=5.0)
    assert todo.forget == ["a"]
    assert todo.crashed == []


def test_a_new_version_starts_beside_the_old_which_drains_once_it_runs() -> None:
    v2 = Want({"v2": 1}, 30.0)
    first = plan(v2, [inst("old")], now=0.0)
    assert first.start == {"v2": 1}
    assert first.drain == []
    starting = plan(v2, [inst("old"), inst("new", "admitted", "v2")], now=1.0)
    assert starting.drain == []
    ready = plan(v2, [inst("old"), inst("new", "running", "v2")], now=2.0)
    assert ready.drain == ["old"]
    assert ready.stop == []


def test_the_old_version_drains_only_once_the_gateways_admit_to_the_new() -> None:
    v2 = Want({"v2": 1}, 30.0)
    both = [inst("old"), inst("new", "running", "v2")]
    assert plan(v2, both, now=0.0, ready={"old"}).drain == []  # running, not yet ready
    assert plan(v2, both, now=0.0, ready={"old", "new"}).drain == ["old"]


def test_a_deleted_deployment_drains_everything_at_once() -> None:
    gone = Want({}, 30.0)
    todo = plan(gone, [inst("a"), inst("b", "pending")], now=0.0)
    assert todo.drain == ["a", "b"]
    assert todo.stop == ["b"]
    assert todo.start == {}


def test_a_draining_instance_the_gateways_released_stops_before_the_timeout() -> None:
    zero = Want({"v1": 0}, 30.0)
    draining = [inst("a", draining=10.0), inst("b", draining=10.0)]
    assert plan(zero, draining, now=11.0, released={"b"}).stop == ["b"]


def test_a_rollout_keeps_each_versions_instances_and_only_an_unlisted_one_drains() -> None:
    canary = Want({"v1": 2, "v2": 1}, 30.0)
    first = plan(canary, [inst("a"), inst("b")], now=0.0)
    assert first.start == {"v2": 1}
    assert first.drain == []
    both = [inst("a"), inst("b"), inst("c", version="v2")]
    assert not plan(canary, both, now=1.0).changes
    # promote: v2 takes v1's replicas; v1 drains once v2 serves them
    promoted = Want({"v2": 2}, 30.0)
    growing = plan(promoted, both, now=2.0)
    assert growing.start == {"v2": 1}
    assert growing.drain == []
    grown = [*both, inst("d", version="v2")]
    assert plan(promoted, grown, now=3.0).drain == ["a", "b"]
    # roll back: v2 is no longer listed and v1 serves already: v2 drains at once
    assert plan(Want({"v1": 2}, 30.0), both, now=2.0).drain == ["c"]


def test_a_crashed_canary_waits_for_its_own_back_off_only() -> None:
    canary = Want({"v1": 1, "v2": 1}, 30.0)
    todo = plan(canary, [], now=5.0, next_start={"v1": 9.0})
    assert todo.start == {"v2": 1}
    assert todo.waiting_until == 9.0


def test_without_surge_an_old_version_is_replaced_in_place_one_instance_at_a_time() -> None:
    v2 = Want({"v2": 2}, 30.0, surge=False)
    old = [inst("a", created=1), inst("b", created=2)]
    first = plan(v2, old, now=0.0)
    assert first.start == {}  # no spare slice is taken
    assert first.drain == ["a"]  # the oldest gives its slice up first
    draining = [inst("a", created=1, draining=0.0), inst("b", created=2)]
    assert not plan(v2, draining, now=1.0).changes  # its requests finish first
    stopped = plan(v2, [inst("b", created=2)], now=2.0)
    assert stopped.start == {"v2": 1}
    assert stopped.drain == []
    starting = [inst("b", created=2), inst("c", "admitted", "v2", created=3)]
    assert not plan(v2, starting, now=3.0).changes  # b drains once c serves
    serving = [inst("b", created=2), inst("c", "running", "v2", created=3)]
    assert plan(v2, serving, now=4.0, ready={"b"}).drain == []  # not yet ready in the gateway
    assert plan(v2, serving, now=4.0, ready={"b", "c"}).drain == ["b"]
    assert plan(v2, [inst("c", "running", "v2")], now=5.0).start == {"v2": 1}


def test_without_surge_new_instances_waiting_for_a_slice_let_an_old_one_give_its_up() -> None:
    v2 = Want({"v2": 1}, 30.0, surge=False)
    waiting = [inst("a"), inst("p", "pending", "v2", created=1)]
    assert plan(v2, waiting, now=0.0).drain == ["a"]
    placed = [inst("a"), inst("p", "admitted", "v2", created=1)]
    assert plan(v2, placed, now=0.0).drain == []  # placed, not yet serving: a waits


def test_a_lost_instance_is_replaced_at_once_without_a_back_off() -> None:
    lost = Instance("a", "v1", "running", 0.0, lost="cluster east is unreachable")
    todo = plan(V1, [lost, inst("b")], now=5.0)
    assert [i.job_id for i in todo.lost] == ["a"]
    assert todo.crashed == []  # it did not crash: no back-off holds its replacement
    assert todo.start == {"v1": 1}
    assert todo.stop == []  # nothing to send where nothing answers
    # lost while draining: recorded ended too, and it no longer holds a slice
    draining = Instance("c", "v1", "running", 0.0, draining_since=1.0, lost="gone")
    assert [i.job_id for i in plan(V1, [draining, inst("b")], now=5.0).lost] == ["c"]
    # next round its job has ended; it drained, so it is forgotten, not counted as a crash
    ended = Instance("a", "v1", "failed", 0.0, draining_since=5.0)
    after = plan(V1, [ended, inst("b"), inst("r", "pending")], now=6.0)
    assert (after.forget, after.crashed, after.start) == (["a"], [], {})
