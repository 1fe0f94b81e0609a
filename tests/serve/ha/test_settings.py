"""`gateway.ha`: what a config file may say, and what each refusal tells the user to do."""

from __future__ import annotations

import pytest

from gpuplane.config import parse_settings
from gpuplane.errors import ConfigError


def _ha(**ha: object) -> dict[str, object]:
    return {"gateway": {"ha": ha}}


def test_defaults_are_off_and_fail_over_within_two_seconds() -> None:
    ha = parse_settings({}).gateway.ha
    assert ha.mode == "off"
    # a standby leads at most ttl + one ask after the leader's last renewal
    assert ha.lease_ttl_s + ha.renew_s <= 2.0
    assert ha.renew_s * 3 <= ha.lease_ttl_s


def test_a_misspelt_key_names_the_nearest() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.ha\.lease_tll_s.*did you mean 'lease_ttl_s'"):
        parse_settings(_ha(mode="primary_standby", path="/tmp/l", lease_tll_s=2))


def test_an_unknown_store_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.ha\.lease.*'file', 'postgresql', 'redis'"):
        parse_settings(_ha(mode="primary_standby", lease="zookeeper"))


@pytest.mark.parametrize(
    ("ha", "says"),
    [
        ({"lease": "file"}, r"lease: file needs `path`"),
        ({"lease": "redis"}, r"lease: redis needs `url` starting with redis:// or rediss://"),
        (
            {"lease": "etcd", "url": "127.0.0.1:2379"},
            r"lease: etcd needs `url` starting with http:// .*e\.g\. http://127\.0\.0\.1:2379",
        ),
        ({"lease": "postgresql", "url": "postgresql://h/db", "path": "/x"}, r"not `path`"),
        ({"lease": "file", "path": "/x", "url": "redis://h"}, r"not `url`"),
        ({"path": "/x", "renew_s": 1.0}, r"renew_s \(1\.0\) must be at most a third"),
        ({"path": "/x", "stop_margin_s": 1.3}, r"stop_margin_s \+ renew_s .* below lease_ttl_s"),
    ],
)
def test_an_incomplete_store_says_what_to_add(ha: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_settings(_ha(mode="primary_standby", **ha))


def test_shared_mode_needs_redis() -> None:
    with pytest.raises(ConfigError, match=r"mode shared keeps its slot table in Redis"):
        parse_settings(_ha(mode="shared", path="/x"))


def test_off_needs_no_store() -> None:
    assert parse_settings(_ha(mode="off", lease="redis")).gateway.ha.url is None


def test_each_store_accepts_its_url() -> None:
    for lease, url in (
        ("postgresql", "postgresql://gw@127.0.0.1:5432/gpuplane"),
        ("redis", "redis://127.0.0.1:6379/0"),
        ("etcd", "http://127.0.0.1:2379"),
    ):
        ha = parse_settings(_ha(mode="primary_standby", lease=lease, url=url)).gateway.ha
        assert (ha.lease, ha.url) == (lease, url)
