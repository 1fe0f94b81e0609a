"""Policies by name: the default, and an unknown name that lists the valid ones."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import DEFAULT_POLICY, UnknownPolicyError, make_policy


def test_default_policy_is_gpuplanes_fragmentation_aware_one() -> None:
    assert DEFAULT_POLICY == "frag"
    assert make_policy().name == "frag"  # made by default


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        make_policy("first-fit")
    for name in ("frag", "fgd", "best-fit", "binpack", "spread", "packing", "random"):
        assert name in str(info.value)
    assert make_policy("best_fit").name == "best-fit"
