"""The score phase's GPU-speed term on hand-made snapshots: how it is normalised and weighted
against the policy's own score, and that equal speeds change nothing."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplane.control.scheduler import (
    DEFAULT_SPEED_WEIGHT,
    MAX_NODE_SCORE,
    Decision,
    Policy,
    Request,
    Snapshot,
    make_policy,
    policy_names,
    schedule,
    speed_score,
)
from gpuplane.errors import ConfigError
from gpuplane.resources import Selector
from tests.control.scheduler import sched_helpers
from tests.control.scheduler.sched_helpers import GIB, mixed, node


def decide(snap: Snapshot, req: Request, policy: Policy | str, seed: int = 0) -> Decision:
    """A policy given by name gets the speed term at weight 1 (it is off by default)."""
    return sched_helpers.decide(snap, req, policy, seed, speed_weight=1.0)


def node_of(snap: Snapshot, req: Request, policy: Policy | str, seed: int = 0) -> str:
    return sched_helpers.node_of(snap, req, policy, seed, speed_weight=1.0)


def test_the_term_is_relative_to_the_fastest_candidate_and_absent_when_all_are_equal() -> None:
    term = speed_score(np.array([0.5, 0.8, 1.0]))
    assert term is not None
    assert term.tolist() == pytest.approx([50.0, 80.0, MAX_NODE_SCORE])
    doubled = speed_score(np.array([1.0, 1.6, 2.0]))  # only ratios matter
    assert doubled is not None
    assert doubled.tolist() == pytest.approx(term.tolist())
    assert speed_score(np.array([0.7, 0.7])) is None
    assert speed_score(np.array([], dtype=np.float64)) is None


@pytest.mark.parametrize("policy", ["frag", "fgd", "best-fit", "binpack", "spread", "packing"])
@pytest.mark.parametrize(
    "req",
    [
        Request("whole", gpus=2, cpu_millis=4000),
        Request("share", gpu_milli=250, gpu_mem_mib=8 * GIB, cpu_millis=2000),
    ],
)
def test_every_policy_prefers_the_fastest_free_cards(policy: str, req: Request) -> None:
    snap = mixed()
    assert node_of(snap, req, policy) == "fast"
    # with the A100s busy, the L40S beats the A10 (slow comes first in snapshot order)
    snap.commit(decide(snap, Request("fill", gpus=8), "best-fit", 0).placement)  # type: ignore[arg-type]
    assert snap.allocations["fill"].node == "fast"
    assert node_of(snap, req, policy) == "mid"


@pytest.mark.parametrize("policy", ["frag", "best-fit", "packing"])
def test_without_speed_data_or_with_weight_zero_the_policy_alone_decides(policy: str) -> None:
    req = Request("j", gpus=1, cpu_millis=1000)
    # equal speeds: these policies break the tie by snapshot order, so the first node wins
    assert node_of(mixed(A10=1.0, L40S=1.0, A100=1.0), req, policy) == "slow"
    assert node_of(mixed(), req, make_policy(policy, speed_weight=0)) == "slow"


def test_a_selector_for_one_model_is_not_pulled_elsewhere() -> None:
    req = Request("j", gpus=1, selector=Selector(gpu_models=frozenset({"A10"})))
    assert node_of(mixed(), req, "frag") == "slow"
    two = Request("k", gpus=1, selector=Selector(gpu_models=frozenset({"A10", "L40S"})))
    assert node_of(mixed(), two, "frag") == "mid"


def test_cpu_only_requests_ignore_speed() -> None:
    req = Request("cpu", cpu_millis=1000)
    assert node_of(mixed(), req, "best-fit") == node_of(
        mixed(A10=1, L40S=1, A100=1), req, "best-fit"
    )


def test_the_weight_trades_speed_against_the_policy_score() -> None:
    """Best-Fit strongly prefers an almost full slow node (score ~97) over an empty fast one
    (~6): a gap of ~91 points. The speed term gives the fast node 100 x weight and the half-speed
    node 50 x weight, so weight 1 (a 50-point pull) keeps Best-Fit's choice; weight 2 (100)
    overturns it."""
    snap = Snapshot(
        [node("slow", model="A10", cpu=64_000), node("fast", model="A100", cpu=64_000)],
        gpu_speeds={"A10": 0.5, "A100": 1.0},
    )
    snap.commit(decide(snap, Request("big", gpus=7, cpu_millis=60_000), "best-fit").placement)  # type: ignore[arg-type]
    snap.release("big")
    snap.commit(
        decide(
            snap,
            Request(
                "big", gpus=7, cpu_millis=60_000, selector=Selector(gpu_models=frozenset({"A10"}))
            ),
            "best-fit",
        ).placement  # type: ignore[arg-type]
    )
    req = Request("j", gpus=1, cpu_millis=1000)
    plain = decide(snap, req, make_policy("best-fit", speed_weight=0))
    assert plain.placement is not None
    assert plain.placement.node == "slow"
    assert plain.score is not None
    assert plain.score > 90
    weighted = decide(snap, req, make_policy("best-fit", speed_weight=1.0))
    assert weighted.placement is not None
    assert weighted.placement.node == "slow"
    assert weighted.score == pytest.approx(plain.score + 50.0)  # the decision carries the total
    strong = decide(snap, req, make_policy("best-fit", speed_weight=2.0))
    assert strong.placement is not None
    assert strong.placement.node == "fast"


def test_the_term_is_rescaled_to_policies_scored_on_zero_to_one() -> None:
    """binpack scores utilisation in [0, 1]: the term is rescaled to that range, so at weight 1
    a half-speed node loses 0.5, more than a fuller node gains in utilisation here."""
    snap = mixed(A10=0.5, L40S=1.0, A100=1.0)
    snap.commit(
        decide(
            snap,
            Request("some", gpus=2, selector=Selector(gpu_models=frozenset({"A10"}))),
            "binpack",
        ).placement  # type: ignore[arg-type]
    )
    req = Request("j", gpus=1)
    assert node_of(snap, req, make_policy("binpack", speed_weight=0)) == "slow"
    d = decide(snap, req, "binpack")
    assert d.placement is not None
    assert d.placement.node in {"mid", "fast"}
    assert d.score is not None
    assert 1.0 <= d.score <= 2.0


def test_equal_speeds_change_no_decision_of_any_policy() -> None:
    """The same random stream of requests on a snapshot without speeds and on one where every
    model has the same speed: identical placements and scores, for every policy."""
    inventory = [
        node(f"n{i}", cards=c, card_gib=g, model=m, cpu=32_000 * (1 + i % 2))
        for i, (c, g, m) in enumerate(
            [(8, 80, "A100"), (4, 24, "A10"), (8, 48, "L40S"), (2, 80, "A100"), (8, 24, "A10")]
        )
    ]
    gen = np.random.default_rng(7)
    reqs = []
    for k in range(120):
        kind = int(gen.integers(3))
        if kind == 0:
            reqs.append(Request(f"j{k}", gpus=int(gen.choice([1, 2, 4])), cpu_millis=2000))
        elif kind == 1:
            reqs.append(
                Request(f"j{k}", gpu_milli=int(gen.choice([100, 250, 500])), cpu_millis=500)
            )
        else:
            reqs.append(Request(f"j{k}", cpu_millis=1000, memory_mib=4 * GIB))
    for name in policy_names():
        runs = []
        for speeds in (None, {"A100": 1.5, "A10": 1.5, "L40S": 1.5}):
            snap = Snapshot(inventory, gpu_speeds=speeds)
            policy = make_policy(name, speed_weight=1.0)
            rng = np.random.default_rng(3)
            out = []
            for i, r in enumerate(reqs):
                d = schedule(snap, r, policy, rng)
                out.append((d.placement, d.score))
                if d.placement is not None:
                    snap.commit(d.placement)
                if i % 5 == 4:
                    snap.release(reqs[i - 3].job_id)
            runs.append(out)
        assert runs[0] == runs[1], name


def test_the_term_is_off_unless_a_weight_is_given() -> None:
    assert DEFAULT_SPEED_WEIGHT == 0.0
    req = Request("j", gpus=1)
    for name in policy_names():
        with_speeds = node_of(mixed(), req, make_policy(name))
        assert with_speeds == node_of(mixed(A10=1, L40S=1, A100=1), req, make_policy(name))
    assert node_of(mixed(), req, make_policy("frag", speed_weight=0.5)) == "fast"


def test_speed_weight_must_not_be_negative() -> None:
    assert make_policy("frag").speed_weight == DEFAULT_SPEED_WEIGHT
    with pytest.raises(ConfigError, match="speed_weight must be >= 0"):
        make_policy("frag", speed_weight=-1)
    with pytest.raises(ConfigError, match="speed_weight must be >= 0"):
        make_policy("best-fit", speed_weight=float("nan"))
