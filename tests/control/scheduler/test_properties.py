"""Property tests: no sequence of schedule / commit / release over-allocates anything."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpuplane.control.scheduler import (
    MILLI_PER_GPU,
    DeviceInfo,
    NodeInfo,
    Request,
    SchedulingConflict,
    Snapshot,
    make_policy,
    policy_names,
    schedule,
)

nodes_st = st.lists(
    st.tuples(
        st.integers(1, 4),  # cards
        st.sampled_from([16_384, 24_576, 81_920]),  # card memory
        st.integers(4_000, 32_000),  # cpu
        st.integers(8_192, 65_536),  # memory
        st.booleans(),  # splittable
    ),
    min_size=1,
    max_size=4,
)

request_st = st.one_of(
    st.builds(Request, st.just(""), gpus=st.integers(1, 4), cpu_millis=st.integers(0, 4_000)),
    st.builds(
        Request,
        st.just(""),
        gpu_milli=st.integers(1, 1000),
        gpu_mem_mib=st.none() | st.integers(1, 30_000),
        cpu_millis=st.integers(0, 4_000),
    ),
    st.builds(
        Request, st.just(""), cpu_millis=st.integers(1, 16_000), memory_mib=st.integers(0, 20_000)
    ),
)

ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), request_st),
        st.tuples(st.just("race"), request_st),  # two decisions on one view, both committed
        st.tuples(st.just("release"), st.integers(0, 50)),
    ),
    min_size=5,
    max_size=40,
)


def build(spec: list[tuple[int, int, int, int, bool]]) -> Snapshot:
    return Snapshot(
        NodeInfo(
            f"n{i}",
            f"c{i % 2}",
            cpu,
            mem,
            tuple(DeviceInfo(d, card_mem) for d in range(cards)),
            {"gpuplane.io/vgpu-splittable": str(split).lower()},
        )
        for i, (cards, card_mem, cpu, mem, split) in enumerate(spec)
    )


def named(job: str, req: Request) -> Request:
    return replace(req, job_id=job)


def assert_consistent(snap: Snapshot) -> None:
    """Free = capacity - what the committed placements hold, and never below zero; each node
    lists its own placements."""
    cpu = snap.cpu_cap.copy()
    mem = snap.mem_cap.copy()
    dev_milli = snap.dev_milli_cap.copy()
    dev_mem = snap.dev_mem_cap.copy()
    tenants: dict[tuple[int, int], list[bool]] = defaultdict(list)
    for p in snap.allocations.values():
        i = snap.index[p.node]
        cpu[i] -= p.cpu_millis
        mem[i] -= p.memory_mib
        for g in p.devices:
            dev_milli[i, g.index] -= g.gpu_milli
            dev_mem[i, g.index] -= g.mem_mib
            whole = g.gpu_milli == MILLI_PER_GPU and g.mem_mib == snap.dev_mem_cap[i, g.index]
            tenants[(i, g.index)].append(whole)
    assert (cpu == snap.cpu_free).all()
    assert (mem == snap.mem_free).all()
    assert (dev_milli == snap.dev_milli_free).all()
    assert (dev_mem == snap.dev_mem_free).all()
    for arr in (cpu, mem, dev_milli, dev_mem):
        assert (arr >= 0).all(), "over-allocated"
    # a card held whole has no other tenant
    for holders in tenants.values():
        assert not any(holders) or len(holders) == 1, "a whole card is shared"
    # aggregates agree with the cards
    full = (snap.dev_milli_free == snap.dev_milli_cap) & (snap.dev_mem_free == snap.dev_mem_cap)
    assert ((full & snap.dev_exists).sum(axis=1) == snap.full_free).all()
    # the per-node index lists exactly the committed placements
    for n in snap.nodes:
        on = [p for p in snap.allocations.values() if p.node == n.name]
        assert snap.placements_on(n.name) == on


@settings(max_examples=200, deadline=None)
@given(nodes=nodes_st, ops=ops_st, policy=st.sampled_from(policy_names()), seed=st.integers(0, 9))
def test_no_sequence_of_requests_over_allocates(
    nodes: list[tuple[int, int, int, int, bool]],
    ops: list[tuple[str, object]],
    policy: str,
    seed: int,
) -> None:
    snap = build(nodes)
    pol = make_policy(policy)
    rng = np.random.default_rng(seed)
    jobs: list[str] = []
    placed = 0
    for n, (op, arg) in enumerate(ops):
        if op == "release":
            if jobs:
                job = jobs.pop(int(arg) % len(jobs))  # type: ignore[call-overload]
                assert snap.release(job) is not None
                assert snap.release(job) is None
        elif op == "submit":
            d = schedule(snap, named(f"j{n}", arg), pol, rng)  # type: ignore[arg-type]
            if d.placement is not None:
                snap.commit(d.placement)
                jobs.append(d.job_id)
                placed += 1
            else:
                assert d.reasons, "a refusal always says why"
        else:  # two submitters decide on the same view, then both try to commit
            a = schedule(snap, named(f"a{n}", arg), pol, rng)  # type: ignore[arg-type]
            b = schedule(snap, named(f"b{n}", arg), pol, rng)  # type: ignore[arg-type]
            for d in (a, b):
                if d.placement is None:
                    continue
                try:
                    snap.commit(d.placement)
                    jobs.append(d.job_id)
                except SchedulingConflict:
                    pass
        assert_consistent(snap)
    event(f"placed {min(placed, 5)}+" if placed >= 5 else f"placed {placed}")
