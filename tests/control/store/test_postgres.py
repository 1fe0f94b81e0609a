"""The store and the service on a real PostgreSQL server that these tests start themselves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpuplane.control.store import queries
from gpuplane.control.store.models import Base
from gpuplane.control.store.store import Store
from tests.control.svc_helpers import (
    assert_gpu_milli_columns_renamed_in_place,
    assert_no_device_over_allocated,
    assert_quota_respected,
    config,
    job,
    make_service,
    submit_concurrently,
    wait_state,
)
from tests.helpers.control import LIMITS, TEAMS, shapes

pytestmark = pytest.mark.slow


def test_migrations_match_the_models_on_postgres(pg_database: Callable[[], str]) -> None:
    db = pg_database()
    store = Store.open(db)
    try:
        store.migrate()  # idempotent
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        store.close()


def test_the_lock_row_serialises_postgres_transactions(pg_database: Callable[[], str]) -> None:
    db = pg_database()
    store = Store.open(db)
    seen: list[int] = []
    guard = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            with store.locked() as (_, version), guard:
                seen.append(version)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert sorted(seen) == list(range(1, 61))  # every transaction saw its own version


def test_the_minimal_job_runs_with_a_postgres_store(
    pg_database: Callable[[], str], tmp_path: Path
) -> None:
    db = pg_database()
    svc = make_service(config(str(tmp_path), db))
    try:
        out = svc.submit(
            job("hello", command=["python", "-c", "print(42)"], gpu_mem_mib=10240, gpu_cores_pct=25)
        )
        assert wait_state(svc, out["id"], "succeeded", "failed").state == "succeeded"
        assert b"".join(queries.job_logs(svc, out["id"])) == b"42\n"
    finally:
        svc.close()


def test_concurrent_submits_through_two_services_on_postgres(
    pg_database: Callable[[], str], tmp_path: Path
) -> None:
    db = pg_database()
    cfg = config(str(tmp_path), db, nodes=2, gpus=4, teams=TEAMS)
    first, second = make_service(cfg, "a"), make_service(cfg, "b")
    try:
        specs = [job(f"w{i}", team="ab"[i % 2], gpus=1) for i in range(16)]
        specs += [
            job(f"f{i}", team="ab"[i % 2], gpu_mem_mib=20480, gpu_cores_pct=20) for i in range(16)
        ]
        submit_concurrently([first, second], specs, threads=12)
        assert_no_device_over_allocated(first)
        assert_quota_respected(first, LIMITS)
    finally:
        first.close()
        second.close()


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(jobs=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), shapes), min_size=4, max_size=12))
def test_property_no_over_allocation_on_postgres(
    pg_database: Callable[[], str], tmp_path: Path, jobs: list[tuple[str, dict[str, Any]]]
) -> None:
    url = pg_database()
    cfg = config(str(tmp_path / url.rsplit("/", 1)[1]), url, nodes=2, gpus=2, teams=TEAMS)
    first, second = make_service(cfg, "a"), make_service(cfg, "b")
    try:
        specs = [job(f"p{i}", team=team, **res) for i, (team, res) in enumerate(jobs)]
        submit_concurrently([first, second], specs)
        assert_no_device_over_allocated(first)
        assert_quota_respected(first, LIMITS)
    finally:
        first.close()
        second.close()


def test_the_milli_gpu_columns_are_renamed_in_place_on_postgres(
    pg_database: Callable[[], str],
) -> None:
    assert_gpu_milli_columns_renamed_in_place(pg_database())
