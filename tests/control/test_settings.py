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


def test_the_service_id_key_and_the_old_instance_key_is_refused_with_its_new_name() -> None:
    """ "Instance" means a serving process: the control-plane process's id is `service_id`, and a
    file still saying `control.instance` is told the key to rename it to."""
    assert parse_settings({"control": {"service_id": "ctl"}}).control.service_id == "ctl"
    with pytest.raises(ConfigError, match=r"'control\.instance' was renamed 'control\.service_id'"):
        parse_settings({"control": {"instance": "ctl"}})
