"""The estate (pure): what only memory holds survives a rebuild from the store."""

from __future__ import annotations

from gpuplane.control.scheduler import Nomination, Request

from .helpers import estate


def test_a_rebuilt_estate_keeps_nominations_of_nodes_it_still_has() -> None:
    old = estate()
    old.nominated = {
        "j": Nomination("a", Request("j", gpus=4)),
        "k": Nomination("gone", Request("k", gpus=4)),
    }
    new = estate()
    new.adopt(old)
    assert set(new.nominated) == {"j"}
    assert set(old.copy().nominated) == {"j", "k"}
