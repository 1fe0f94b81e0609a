"""One scheduling cycle: filter -> score -> the node's cards; `feasible` for submit time.

Pure functions over a `Snapshot`: they never mutate it. Reserving the devices is the caller's
second step (`snapshot.commit(decision.placement)`), which checks again (ask, then commit) and
applies all or nothing; binding is the cluster adapter's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuplane.control.scheduler.base import Policy
from gpuplane.control.scheduler.decision import (
    MILLI_PER_GPU,
    Decision,
    DeviceGrant,
    Placement,
    Request,
)
from gpuplane.control.scheduler.explain import explain, why_not
from gpuplane.control.scheduler.filter import State, filter_nodes, filter_when_empty
from gpuplane.control.scheduler.nomination import Nomination, held_state
from gpuplane.control.scheduler.score import pick
from gpuplane.control.scheduler.snapshot import Snapshot


def schedule(
    snapshot: Snapshot,
    request: Request,
    policy: Policy,
    rng: np.random.Generator,
    nominations: Sequence[Nomination] = (),
) -> Decision:
    """Place `request` on the snapshot's free resources, or say why not per cluster.

    Filter (`filter.py`): schedulable nodes whose labels match the selector, with the free CPU,
    memory and GPU the request needs (whole cards: enough wholly free cards on one node; a
    fraction: one card with enough free compute and memory). Score (`score.py`): `policy`,
    highest wins; ties go to a random candidate drawn with `rng`, or the earliest for policies
    with `ties = "first"`. Added to the policy's score: the weighted GPU-speed term, which
    prefers faster cards when candidates of several speeds fit (neutral when all are equally
    fast); a request with a `spread` group goes to the candidates whose cluster, then node,
    holds the fewest of its group. Cards: the policy's choice, else the best-fitting card
    (fractions) or the lowest-numbered free cards (whole). `nominations`: what nominated nodes
    hold from this request (`nomination.py`; leave the request's own nomination out); where
    only they stand in the way, the cluster's reason is `BlockedByNomination`
    (`explain.why_not`). Pure: the caller commits `decision.placement`.
    """
    policy.observe(request)
    state = held_state(snapshot, nominations)
    cands = filter_nodes(snapshot, request, state)
    if len(cands) == 0:
        return Decision(request.job_id, None, why_not(snapshot, request, nominations), policy.name)
    chosen, scores, total = pick(cands, policy, rng)
    if request.is_fractional:
        cards = scores.cards if scores.cards is not None else cands.best_fit_cards()
        card = int(cards[chosen])
        assert cands.card_fit is not None
        assert cands.card_mem is not None
        assert cands.card_fit[chosen, card], "policy chose a card that does not fit"
        grants: tuple[DeviceGrant, ...] = (
            DeviceGrant(card, int(cands.card_mem[chosen, card]), request.gpu_milli),
        )
    else:
        grants = _whole_cards(snapshot, state, int(cands.nodes[chosen]), request.gpus)
    node = snapshot.nodes[int(cands.nodes[chosen])]
    placement = Placement(
        request.job_id,
        node.cluster,
        node.name,
        grants,
        request.cpu_millis,
        request.memory_mib,
        request.spread,
    )
    return Decision(request.job_id, placement, (), policy.name, total)


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


def _whole_cards(snapshot: Snapshot, state: State, row: int, count: int) -> tuple[DeviceGrant, ...]:
    """The `count` lowest-numbered wholly free cards of node `row` (as `state` sees them: a
    card a nomination holds is not free)."""
    if count == 0:
        return ()
    idx = np.flatnonzero(snapshot.wholly_free(row, state.dev_milli[row], state.dev_mem[row]))[
        :count
    ]
    return tuple(DeviceGrant(int(d), int(snapshot.dev_mem_cap[row, d]), MILLI_PER_GPU) for d in idx)
