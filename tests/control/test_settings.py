"""The `control:` section: node nominations are configured by their glossary names."""

from __future__ import annotations

import pytest

from gpuplane.config import parse_settings
from gpuplane.errors import ConfigError


def test_nominations_have_their_defaults_and_the_old_reservation_keys_are_unknown() -> None:
    control = parse_settings({"control": {}}).control
    assert (control.nominate_after_s, control.max_nominations) == (3600.0, 2)
    given = parse_settings({"control": {"nominate_after_s": 60, "max_nominations": 0}}).control
    assert (given.nominate_after_s, given.max_nominations) == (60.0, 0)
    for old in ("reserve_after_s", "max_reservations"):
        with pytest.raises(ConfigError, match=rf"unknown key 'control\.{old}'.*nominate_after_s"):
            parse_settings({"control": {old: 1}})
