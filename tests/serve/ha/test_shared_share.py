"""The local share a shared gateway admits on while the table is not whole: pure."""

from __future__ import annotations

import itertools

import pytest

from gpuplane.serve.ha.local import local_share


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shares_never_sum_past_the_capacity_even_when_the_lists_differ(
    capacity: int, n: int
) -> None:
    """Every gateway that takes a share is in every list, but a list may also name gateways
    that have just joined or died (more names: never a larger share)."""
    live = [f"gw{i}" for i in range(n)]
    extras = ["new", "dead"]
    for picks in itertools.product(range(len(extras) + 1), repeat=n):
        shares = [
            local_share(capacity, [*live, *extras[:k]], g) for g, k in zip(live, picks, strict=True)
        ]
        assert sum(shares) <= capacity
    assert [local_share(capacity, live, g) for g in live] == [capacity // n] * n


def test_a_gateway_not_in_the_list_gets_no_share() -> None:
    assert local_share(4, ["a", "b"], "c") == 0
    assert local_share(4, [], "c") == 0
