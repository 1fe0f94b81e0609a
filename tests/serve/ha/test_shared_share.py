"""The local share a shared gateway admits on while Redis is unreachable: pure."""

from __future__ import annotations

import pytest

from gpuplane.serve.ha.shared import local_share


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_local_shares_sum_to_the_capacity(capacity: int, n: int) -> None:
    gateways = [f"gw{i}" for i in range(n)]
    for offset in range(4):
        shares = [local_share(capacity, gateways, g, offset) for g in gateways]
        assert sum(shares) == capacity
        assert max(shares) - min(shares) <= 1
    # with fewer slots than gateways, each gateway gets a slot of some instance
    got = {g for o in range(n) for g in gateways if local_share(1, gateways, g, o)}
    assert got == set(gateways)


def test_a_gateway_that_never_saw_the_others_gets_no_share() -> None:
    assert local_share(4, ["a", "b"], "c", 0) == 0
    assert local_share(4, [], "c", 0) == 0
