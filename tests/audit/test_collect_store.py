"""Allocation samples from a live local control plane's store (SQLite and PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.audit.collect import CollectError
from gpuplane.audit.collect.store import Card, Holding, allocation_samples, collect
from gpuplane.audit.sample_store import SampleStore
from gpuplane.cli.main import app
from gpuplane.control.service.service import ControlService
from tests.control.svc_helpers import config, job, make_service, wait_state

CARD = Card("c1", "n1", 0, "A100-80GB", 81920, "GPU-0")


def test_each_step_has_one_row_per_holder_or_one_free_row() -> None:
    a = Holding("job-a", "vision", "c1", "n1", 0, start=10, end=30, mem_mib=10240, cores_pct=25)
    b = Holding("job-b", "nlp", "c1", "n1", 0, start=20, end=None, mem_mib=None, cores_pct=40)
    other = Card("c1", "n1", 1, "A100-80GB", 81920)
    rows = allocation_samples([CARD, other], [a, b], since=0, until=40, step_s=10).to_pylist()
    on_card = {(r["time"].timestamp(), r["workload"]) for r in rows if r["card"] == "GPU-0"}
    assert on_card == {(0, ""), (10, "job-a"), (20, "job-a"), (20, "job-b"), (30, "job-b")}
    b_row = next(r for r in rows if r["workload"] == "job-b")
    # a slice without a memory limit may use the whole card (HAMi's default)
    assert (b_row["alloc_mem_mib"], b_row["alloc_cores_pct"], b_row["kind"]) == (81920, 40, "batch")
    free = [r for r in rows if r["card"] == "n1/1"]  # no UUID: named <node>/<index>
    assert [r["workload"] for r in free] == [""] * 4
    assert {r["alloc_mem_mib"] for r in free} == {0}
    assert {r["mem_used_mib"] for r in rows} == {None}  # usage is not in the store


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ControlService]:
    service = make_service(config(str(tmp_path), gpus=2))
    yield service
    service.close()


def live_samples(service: ControlService, url: str) -> None:
    before = datetime.fromtimestamp(time.time() - 2, UTC)
    shared = service.submit(job("shared", gpu_mem_mib=10240, gpu_cores_pct=25))["id"]
    whole = service.submit(job("whole", command=["sleep", "1"], gpus=1))["id"]
    wait_state(service, shared, "running")
    wait_state(service, whole, "succeeded")
    service.cancel(shared)
    wait_state(service, shared, "cancelled", "failed")
    after = datetime.fromtimestamp(time.time() + 2, UTC)
    rows = collect(url, before, after, step_s=1).to_pylist()
    held = {r["workload"] for r in rows}
    assert held == {"", shared, whole}
    mine = [r for r in rows if r["workload"] == shared]
    assert {(r["alloc_mem_mib"], r["alloc_cores_pct"], r["team"]) for r in mine} == {
        (10240, 25, "research")
    }
    full = [r for r in rows if r["workload"] == whole]
    assert {(r["alloc_mem_mib"], r["alloc_cores_pct"]) for r in full} == {(81920, 100)}
    steps = {r["time"] for r in rows}
    cards = {r["card"] for r in rows}
    assert cards == {"n0/0", "n0/1"}
    # every card has a row at every step, and only jobs that ran hold rows
    for t in steps:
        assert {r["card"] for r in rows if r["time"] == t} == cards


def test_allocations_from_a_live_sqlite_control_plane(svc: ControlService) -> None:
    live_samples(svc, svc.store.url)


@pytest.mark.slow
def test_allocations_from_a_live_postgres_control_plane(
    tmp_path: Path, pg_database: Callable[[], str]
) -> None:
    service = make_service(config(str(tmp_path), pg_database(), gpus=2))
    try:
        live_samples(service, service.store.url)
    finally:
        service.close()


def test_cli_collects_from_the_store_and_says_what_is_wrong(
    svc: ControlService, tmp_path: Path
) -> None:
    svc.submit(job("one", command=["sleep", "1"], gpus=1))
    out = tmp_path / "samples"
    runner = CliRunner()
    args = ["audit", "collect", "-s", "control", "--out", str(out), "--since", "10m"]
    result = runner.invoke(app, [*args, "--db", svc.store.url])
    assert result.exit_code == 0, result.output
    assert SampleStore(out).scan().num_rows == 2 * 10  # 2 cards x 10 one-minute steps
    bad = runner.invoke(app, [*args, "--db", f"sqlite:///{tmp_path / 'nothing.db'}"])
    assert bad.exit_code == 1
    assert "cannot read the control plane's store" in bad.output
    assert "no such table" in bad.output


def test_an_unreadable_store_is_a_collect_error(tmp_path: Path) -> None:
    with pytest.raises(CollectError, match="database_url of `control:`"):
        collect(f"sqlite:///{tmp_path / 'x.db'}", datetime.now(UTC), datetime.now(UTC))
