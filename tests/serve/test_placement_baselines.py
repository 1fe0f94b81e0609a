"""The baseline placement policies the benchmark compares against: round robin, least
connections, power of two choices."""

from __future__ import annotations

import random

import pytest

from gpuplane.config import parse_settings
from gpuplane.errors import ConfigError
from gpuplane.serve.placement import make_policy
from gpuplane.serve.slots import InstanceSlots


def fleet(*in_flight: int, capacity: int = 4) -> list[InstanceSlots]:
    return [InstanceSlots(f"i{n}", f"http://i{n}", capacity, f) for n, f in enumerate(in_flight)]


def test_round_robin_cycles_in_order_and_skips_full_instances() -> None:
    policy = make_policy("round_robin", 0.5)
    rng = random.Random(0)
    insts = fleet(0, 0, 0)
    picks = [policy.choose(insts, {}, rng) for _ in range(4)]
    assert [p.instance_id for p in picks if p] == ["i0", "i1", "i2", "i0"]
    # i1 is not a candidate (no free slot): the turn passes to i2
    picked = policy.choose([insts[0], insts[2]], {}, rng)
    assert picked is not None
    assert picked.instance_id == "i2"
    assert policy.choose([], {}, rng) is None


def test_least_connections_counts_requests_not_utilisation() -> None:
    policy = make_policy("least_connections", 0.5)
    insts = [InstanceSlots("big", "u", 10, 3), InstanceSlots("small", "u", 2, 1)]
    choice = policy.choose(insts, {"big": 9}, random.Random(0))
    assert choice is not None
    assert choice.instance_id == "small"
    assert not policy.uses_prefix


def test_power_of_two_takes_the_less_loaded_of_two_random_candidates() -> None:
    policy = make_policy("power_of_two", 0.5)
    rng = random.Random(1)
    insts = fleet(3, 0, 3, 3)
    picks = [policy.choose(insts, {}, rng) for _ in range(200)]
    chosen = [p.instance_id for p in picks if p]
    # i1 wins whenever it is drawn (half the draws), never the most loaded when i1 is in the pair
    assert 0.4 < chosen.count("i1") / len(chosen) < 0.6
    one = policy.choose(fleet(2), {}, rng)
    assert one is not None
    assert one.instance_id == "i0"


@pytest.mark.parametrize("name", ["round_robin", "least_connections", "power_of_two"])
def test_baselines_are_selectable_in_config(name: str) -> None:
    settings = parse_settings({"gateway": {"placement": {"policy": name}}})
    assert settings.gateway.placement.policy == name
    assert not make_policy(name, 0.5).uses_prefix


def test_an_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="round_robin"):
        make_policy("round_robbin", 0.5)
