"""One contract over every lease store, each against its real server on loopback (the file
store on a temp dir): acquire, renew, lose on expiry, the epoch grows on every change of
holder, a write in an older epoch is refused, and a store that does not answer is not a
leader's."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpuplane.serve.ha.lease import Change, Election, Fenced, StoreUnavailable
from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import LeaseStore, make_store
from tests.helpers.common import free_port

pytestmark = pytest.mark.anyio

TTL = 1.0  # etcd grants at least 2 s: its tests count with what it granted

Stores = Callable[[], LeaseStore]


def _config(kind: str, request: pytest.FixtureRequest, tmp_path: Path, key: str) -> HaConfig:
    if kind == "file":
        return HaConfig(mode="primary_standby", lease="file", path=str(tmp_path / "lease"), key=key)
    server = {"postgresql": "postgres_url", "redis": "redis_server", "etcd": "etcd_server"}[kind]
    url = request.getfixturevalue(server)
    return HaConfig(mode="primary_standby", lease=kind, url=url, key=key, lease_ttl_s=3.0)


@pytest.fixture(params=["file", "postgresql", "redis", "etcd"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    """Clients of one store kind on one fresh lease key, one per simulated gateway."""
    cfg = _config(request.param, request, tmp_path, f"test-{uuid.uuid4().hex[:8]}")
    made: list[LeaseStore] = []

    def make() -> LeaseStore:
        made.append(make_store(cfg, timeout_s=2.0))
        return made[-1]

    yield make
    for store in made:
        await store.aclose()


async def test_the_first_claim_leads_and_a_second_gateway_sees_it(stores: Stores) -> None:
    a, b = stores(), stores()
    got = await a.claim("a", "http://a", TTL)
    assert (got.holder, got.url) == ("a", "http://a")
    assert got.epoch >= 1
    assert got.ttl_s > 0
    seen = await b.claim("b", "http://b", TTL)
    assert (seen.holder, seen.epoch, seen.url) == ("a", got.epoch, "http://a")


async def test_renewing_keeps_the_lease_and_its_epoch_past_the_ttl(stores: Stores) -> None:
    a, b = stores(), stores()
    first = await a.claim("a", None, TTL)
    for _ in range(int(first.ttl_s / 0.25) + 3):  # well past one TTL, renewed every 0.25 s
        await asyncio.sleep(0.25)
        renewed = await a.claim("a", None, TTL)
        assert (renewed.holder, renewed.epoch) == ("a", first.epoch)
    assert (await b.claim("b", None, TTL)).holder == "a"


async def test_an_unrenewed_lease_runs_out_and_the_next_holder_is_in_a_newer_epoch(
    stores: Stores,
) -> None:
    a, b = stores(), stores()
    first = await a.claim("a", None, TTL)
    await asyncio.sleep(first.ttl_s)
    # the store expires it on its own clock (etcd's leader revokes expired leases in a tick of
    # its own): ask until it has, within a bound that a loaded machine cannot reach
    for _ in range(100):
        taken = await b.claim("b", None, TTL)
        if taken.holder == "b":
            break
        await asyncio.sleep(0.1)
    assert taken.holder == "b"
    assert taken.epoch > first.epoch
    back = await a.claim("a", None, TTL)  # the old holder finds it taken, not renewed
    assert (back.holder, back.epoch) == ("b", taken.epoch)


async def test_a_release_hands_over_at_once_and_is_idempotent(stores: Stores) -> None:
    a, b = stores(), stores()
    first = await a.claim("a", None, TTL)
    await a.release("a", first.epoch)
    await a.release("a", first.epoch)
    taken = await b.claim("b", None, TTL)
    assert taken.holder == "b"
    assert taken.epoch > first.epoch
    await a.release("a", first.epoch)  # a stale release leaves the new holder alone
    assert (await b.claim("b", None, TTL)).epoch == taken.epoch


async def test_a_write_in_an_older_epoch_is_refused(stores: Stores) -> None:
    a, b = stores(), stores()
    first = await a.claim("a", None, TTL)
    await a.write_journal(first.epoch, b'{"m": {"i0": 3}}')
    journal = await b.read_journal()
    assert journal is not None
    assert (journal.epoch, journal.data) == (
        first.epoch,
        b'{"m": {"i0": 3}}',
    )
    await a.release("a", first.epoch)
    taken = await b.claim("b", None, TTL)
    await b.write_journal(taken.epoch, b'{"m": {"i0": 1}}')
    with pytest.raises(Fenced, match=rf"epoch {first.epoch} was refused"):
        await a.write_journal(first.epoch, b'{"m": {"i0": 4}}')
    kept = await a.read_journal()
    assert kept is not None
    assert (kept.epoch, kept.data) == (taken.epoch, b'{"m": {"i0": 1}}')


@pytest.mark.parametrize("kind", ["file", "postgresql", "redis", "etcd"])
async def test_a_store_that_does_not_answer_makes_no_leader(tmp_path: Path, kind: str) -> None:
    if kind == "file":  # a lease file under a plain file cannot be opened
        (tmp_path / "f").write_text("")
        cfg = HaConfig(mode="primary_standby", path=str(tmp_path / "f" / "lease"))
    else:
        scheme = {"postgresql": "postgresql", "redis": "redis", "etcd": "http"}[kind]
        url = f"{scheme}://127.0.0.1:{free_port()}"  # nothing listens there
        cfg = HaConfig(mode="primary_standby", lease=kind, url=url)
    store = make_store(cfg, timeout_s=1.0)
    election = Election("a", cfg.stop_margin_s)
    try:
        with pytest.raises(StoreUnavailable, match=rf"the {kind} lease store"):
            await store.claim("a", None, TTL)
        assert election.answered(0.0, None, 0.1) is Change.NONE
        assert election.can_admit(0.1) is not None
        with pytest.raises(StoreUnavailable):
            await store.write_journal(1, b"{}")
        await store.release("a", 1)  # never fails
    finally:
        await store.aclose()
