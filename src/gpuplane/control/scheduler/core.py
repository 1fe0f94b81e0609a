"""The scheduling cycle: filter -> score -> pick a node and its cards; `feasible` for submit time.

Pure functions over a `Snapshot`: they never mutate it. Committing is the caller's second step
(`snapshot.commit(decision.placement)`), which checks again (ask, then commit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from types import MappingProxyType

import numpy as np

from gpuplane.control.scheduler.base import Candidates, FloatArray, Policy
from gpuplane.control.scheduler.explain import State, capacity_state, explain, free_state
from gpuplane.control.scheduler.hold import Hold, expected_start, held_state
from gpuplane.control.scheduler.snapshot import (
    MILLI_PER_GPU,
    BoolArray,
    ClusterReason,
    Decision,
    DeviceGrant,
    IntArray,
    Placement,
    ReasonCode,
    Request,
    Snapshot,
)
from gpuplane.control.scheduler.speed import MAX_NODE_SCORE, speed_score


def schedule(
    snapshot: Snapshot,
    request: Request,
    policy: Policy,
    rng: np.random.Generator,
    holds: Sequence[Hold] = (),
) -> Decision:
    """Place `request` on the snapshot's free resources, or say why not per cluster.

    Filter: schedulable nodes whose labels match the selector, with the free CPU, memory and GPU
    the request needs (whole cards: enough wholly free cards on one node; a fraction: one card
    with enough free compute and memory). Score: `policy`, highest wins; ties go to a random
    candidate drawn with `rng`, or the earliest for policies with `ties = "first"`. Added to the
    policy's score: the weighted GPU-speed term, which prefers faster cards when candidates of
    several speeds fit (`speed.py`; neutral when all are equally fast).
    Cards: the policy's choice, else the best-fitting card (fractions) or the lowest-numbered
    free cards (whole). `holds`: what node reservations keep from this request (`hold.py`;
    leave the request's own hold out); where only they stand in the way, the cluster's reason
    is `BlockedByReservation`. Pure: the caller commits `decision.placement`.
    """
    policy.observe(request)
    state = held_state(snapshot, holds)
    cands = filter_nodes(snapshot, request, state)
    if len(cands) == 0:
        return Decision(request.job_id, None, _why_not(snapshot, request, holds), policy.name)
    cands.rng = rng
    scores = policy.score(cands)
    total = _with_speed(scores.nodes, cands, policy)
    best = np.flatnonzero(total == total.max())
    if len(best) > 1 and policy.ties == "random":
        pick = int(best[rng.integers(len(best))])
    else:
        pick = int(best[0])
    if request.is_fractional:
        cards = scores.cards if scores.cards is not None else cands.best_fit_cards()
        card = int(cards[pick])
        assert cands.card_fit is not None
        assert cands.card_mem is not None
        assert cands.card_fit[pick, card], "policy chose a card that does not fit"
        grants: tuple[DeviceGrant, ...] = (
            DeviceGrant(card, int(cands.card_mem[pick, card]), request.gpu_milli),
        )
    else:
        grants = _whole_cards(snapshot, state, int(cands.nodes[pick]), request.gpus)
    node = snapshot.nodes[int(cands.nodes[pick])]
    placement = Placement(
        request.job_id, node.cluster, node.name, grants, request.cpu_millis, request.memory_mib
    )
    return Decision(request.job_id, placement, (), policy.name, float(total[pick]))


def _why_not(
    snapshot: Snapshot, request: Request, holds: Sequence[Hold]
) -> tuple[ClusterReason, ...]:
    """`explain`'s reasons, except in clusters where the request would fit but for `holds`."""
    reasons = explain(snapshot, request)
    if not holds:
        return reasons
    free = filter_nodes(snapshot, request, free_state(snapshot))
    if len(free) == 0:
        return reasons
    held = {h.node: h for h in holds}
    blocked: dict[str, list[str]] = {}
    timed: set[str] = set()  # clusters where a hold has an expected start
    for row in free.nodes:
        node = snapshot.nodes[int(row)]
        hold = held[node.name]
        blocked.setdefault(node.cluster, []).append(f"{node.name} (job {hold.request.job_id})")
        if hold.start_s is not None:
            timed.add(node.cluster)
    backfill = (
        "; only jobs whose time limits end before the held jobs' expected starts may use "
        "them meanwhile"
    )
    out = [r for r in reasons if r.cluster not in blocked]
    out += [
        ClusterReason(
            cluster,
            ReasonCode.BLOCKED_BY_RESERVATION,
            "fits only on nodes held for jobs that waited longer: "
            + ", ".join(nodes)
            + (backfill if cluster in timed else ""),
            MappingProxyType({"held_nodes": len(nodes)}),
        )
        for cluster, nodes in blocked.items()
    ]
    return tuple(out)


def _with_speed(nodes: FloatArray, cands: Candidates, policy: Policy) -> FloatArray:
    """The policy's scores plus its weighted GPU-speed term (`speed.py`); unchanged when the
    term is off, the request takes no GPU, or every candidate is equally fast."""
    if not policy.speed_weight or not cands.request.is_gpu:
        return nodes
    term = speed_score(cands.snapshot.gpu_speed[cands.nodes])
    if term is None:
        return nodes
    out: FloatArray = nodes + term * (policy.speed_weight * policy.max_score / MAX_NODE_SCORE)
    return out


def feasible(snapshot: Snapshot, request: Request) -> Decision:
    """Would `request` fit on the estate with nothing running? Reasons per cluster when not.

    The placement of a feasible decision is only an example (first fitting node); submit-time
    refusal (impossible sizes, unknown GPU models, no matching labels) uses `decision.ok`.
    """
    cands = filter_when_empty(snapshot, request)
    if len(cands) == 0:
        return Decision(request.job_id, None, explain(snapshot, request, capacity=True), "")
    i = int(cands.nodes[0])
    node = snapshot.nodes[i]
    if request.is_fractional:
        assert cands.card_fit is not None
        assert cands.card_mem is not None
        card = int(np.argmax(cands.card_fit[0]))
        grants: tuple[DeviceGrant, ...] = (
            DeviceGrant(card, int(cands.card_mem[0, card]), request.gpu_milli),
        )
    else:
        grants = tuple(
            DeviceGrant(d, int(snapshot.dev_mem_cap[i, d]), MILLI_PER_GPU)
            for d in range(request.gpus)
        )
    placement = Placement(
        request.job_id, node.cluster, node.name, grants, request.cpu_millis, request.memory_mib
    )
    return Decision(request.job_id, placement, (), "")


def reservation_node(
    snapshot: Snapshot,
    request: Request,
    taken: Set[str],
    ends: Mapping[str, float] | None = None,
    now: float = 0.0,
) -> str | None:
    """The node a reservation for `request` should hold: of the schedulable nodes where it fits
    when empty and that no other reservation holds, the one expected to drain first; None when
    there is none. Where the time limits of the node's jobs bound when it fits (`ends`: job id
    -> wall-clock end; `hold.expected_start`), that bound is the expected start, and such nodes
    come first, earliest first. Otherwise, without runtime estimates, every running job is taken
    to have the same remaining work, so a node waits for the last of its k jobs (H(k) = 1 + 1/2
    + ... + 1/k times one job's, as for memoryless runtimes) at its GPU speed (`gpu_speed`:
    slower cards run the same work longer): the lowest H(k) / speed wins. Then the most wholly
    free cards, the most free GPU compute, the earliest. Fewer jobs to wait for also means
    fewer cards left idle."""
    rows = filter_when_empty(snapshot, request).nodes
    rows = rows[[snapshot.nodes[int(i)].name not in taken for i in rows]] if taken else rows
    if len(rows) == 0:
        return None
    placed = [snapshot.placements_on(snapshot.nodes[int(i)].name) for i in rows]
    jobs = np.array([len(p) for p in placed])
    harmonic = np.cumsum(np.concatenate(([0.0], 1.0 / np.arange(1, int(jobs.max()) + 1))))
    drain = harmonic[jobs] / snapshot.gpu_speed[rows]
    unknown = np.ones(len(rows), dtype=bool)
    if ends:
        for k, i in enumerate(rows):
            start = expected_start(snapshot, int(i), request, placed[k], ends, now)
            if start is not None:
                unknown[k], drain[k] = False, start
    order = np.lexsort(
        (rows, -snapshot.gpu_milli_free[rows], -snapshot.full_free[rows], drain, unknown)
    )
    return snapshot.nodes[int(rows[order[0]])].name


def filter_when_empty(snapshot: Snapshot, request: Request) -> Candidates:
    """The filter phase against the estate with nothing running: where `request` could ever
    fit (submit-time feasibility, reservation nodes, the GPU models a request may use)."""
    return filter_nodes(snapshot, request, capacity_state(snapshot))


def filter_nodes(snapshot: Snapshot, request: Request, state: State) -> Candidates:
    """The filter phase over per-node aggregates first, then card by card on the survivors."""
    ok: BoolArray = snapshot.schedulable & snapshot.selector_mask(request.selector)
    if request.cpu_millis:
        ok &= state.cpu >= request.cpu_millis
    if request.memory_mib:
        ok &= state.mem >= request.memory_mib
    if request.gpus:
        ok &= state.full_free >= request.gpus
    elif request.is_fractional:
        ok &= snapshot.splittable & (state.max_milli >= request.gpu_milli)
        if request.gpu_mem_mib is not None:
            ok &= state.max_mem >= request.gpu_mem_mib
    rows: IntArray = np.flatnonzero(ok)
    if not request.is_fractional or len(rows) == 0:
        return Candidates(snapshot, request, rows)
    card_mem = request.mem_on(snapshot.dev_mem_cap[rows])
    fit = snapshot.dev_exists[rows] & (state.dev_milli[rows] >= request.gpu_milli)
    fit &= state.dev_mem[rows] >= card_mem
    keep = fit.any(axis=1)
    if not keep.all():
        rows, fit, card_mem = rows[keep], fit[keep], card_mem[keep]
    return Candidates(snapshot, request, rows, fit, card_mem)


def _whole_cards(snapshot: Snapshot, state: State, row: int, count: int) -> tuple[DeviceGrant, ...]:
    """The `count` lowest-numbered wholly free cards of node `row` (as `state` sees them: a
    card a reservation holds is not free)."""
    if count == 0:
        return ()
    idx = np.flatnonzero(snapshot.wholly_free(row, state.dev_milli[row], state.dev_mem[row]))[
        :count
    ]
    return tuple(DeviceGrant(int(d), int(snapshot.dev_mem_cap[row, d]), MILLI_PER_GPU) for d in idx)
