"""The store on real SQLite: migrations match the models, and the placement lock serialises."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, select, text, update

from gpuplane.control.store.models import Base, SchedulerLock
from gpuplane.control.store.store import Store, StoreError
from tests.control.svc_helpers import assert_gpu_milli_columns_renamed_in_place, migrate, old_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path}/state/control.db")
    yield s
    s.close()


def test_migrations_create_every_table_and_match_the_models(store: Store) -> None:
    tables = set(inspect(store.engine).get_table_names())
    assert {
        "clusters",
        "nodes",
        "devices",
        "teams",
        "quotas",
        "jobs",
        "allocations",
        "events",
        "scheduler_lock",
        "alembic_version",
    } <= tables
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"


def test_migrate_is_idempotent_and_keeps_data(store: Store) -> None:
    with store.locked() as (_, version):
        assert version == 1
    store.migrate()
    assert store.version() == 1


def test_locked_transactions_serialise_read_modify_write(store: Store) -> None:
    """Each thread reads a counter and writes it back + 1 under the lock: no update is lost."""
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(10):
                with store.locked() as (session, _):
                    row = session.execute(select(SchedulerLock).where(SchedulerLock.id == 1))
                    lock = row.scalar_one()
                    # a second counter, bumped by read-modify-write: lost updates would show here
                    session.execute(
                        update(SchedulerLock)
                        .where(SchedulerLock.id == 1)
                        .values(version=lock.version + 1)
                    )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.version() == 6 * 10 * 2


def test_a_bad_url_says_what_to_use() -> None:
    with pytest.raises(StoreError, match="sqlite:///"):
        Store("not a url")
    with pytest.raises(StoreError, match="unsupported database 'mysql'"):
        Store("mysql://localhost/db")


def test_an_unwritable_sqlite_file_is_refused_with_the_path(tmp_path: Path) -> None:
    target = tmp_path / "dir-not-file"
    target.mkdir()
    with pytest.raises(StoreError, match="cannot open the store"):
        Store.open(f"sqlite:///{target}")


def test_upgrading_an_old_store_keeps_its_rows(tmp_path: Path) -> None:
    """A store created at the first migration is brought to head on open, data intact."""
    url = f"sqlite:///{tmp_path}/old.db"
    cfg = old_store(
        url,
        "0001",
        "INSERT INTO teams (name, cohort, weight) VALUES ('old', NULL, 1.0)",
        "INSERT INTO quotas (team_name, flavor, nominal_milli_gpus) "
        "VALUES ('old', 'A100-80GB', 2000)",
    )
    store = Store.open(url)
    try:
        with store.engine.connect() as conn:
            head = ScriptDirectory.from_config(cfg).get_current_head()
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
            row = conn.execute(
                text(
                    "SELECT nominal_gpu_milli, lending_limit_gpu_milli "
                    "FROM quotas WHERE team_name = 'old'"
                )
            ).one()
            assert tuple(row) == (2000, None)
    finally:
        store.close()


def test_the_milli_gpu_columns_are_renamed_in_place_keeping_a_running_jobs_card(
    tmp_path: Path,
) -> None:
    assert_gpu_milli_columns_renamed_in_place(f"sqlite:///{tmp_path}/old.db")


def _instances_across(
    tmp_path: Path, before: str, after: str, added: str, column: str
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """A store at `before` with one instance (chat-v1-a: http://h:1, 4 slots), migrated to
    `after`, which `added` (a chat-v1-b row's VALUES) can then hold, and back: each instance's
    (job id, `column`) after each step."""
    url = f"sqlite:///{tmp_path}/old.db"
    insert = (
        "INSERT INTO deployment_instances (job_id, deployment, version, url, capacity, "
        "created_at) VALUES "
    )
    cfg = old_store(
        url,
        before,
        "INSERT INTO deployments (name, spec, deleting, created_at, updated_at) "
        "VALUES ('chat', '{}', 0, 1.0, 1.0)",
        insert + "('chat-v1-a', 'chat', 'v1', 'http://h:1', 4, 1.0)",
    )
    read = f"SELECT job_id, {column} FROM deployment_instances ORDER BY job_id"
    engine = create_engine(url)
    try:
        migrate(engine, cfg, after, insert + added)
        with engine.connect() as conn:
            up = [tuple(r) for r in conn.execute(text(read))]
        migrate(engine, cfg, before, down=True)
        with engine.connect() as conn:
            return up, [tuple(r) for r in conn.execute(text(read))]
    finally:
        engine.dispose()


def test_0011_lets_an_instance_wait_for_its_engines_slots_and_keeps_the_known_ones(
    tmp_path: Path,
) -> None:
    up, down = _instances_across(
        tmp_path, "0010", "0011", "('chat-v1-b', 'chat', 'v1', 'http://h:2', NULL, 2.0)", "capacity"
    )
    assert up == [("chat-v1-a", 4), ("chat-v1-b", None)]  # b: not reported by its engine yet
    assert down == [("chat-v1-a", 4), ("chat-v1-b", 1)]  # back: an unknown capacity becomes 1


def test_0012_lets_an_instance_wait_for_its_address_and_keeps_the_known_ones(
    tmp_path: Path,
) -> None:
    up, down = _instances_across(
        tmp_path, "0011", "0012", "('chat-v1-b', 'chat', 'v1', NULL, 4, 2.0)", "url"
    )
    assert up == [("chat-v1-a", "http://h:1"), ("chat-v1-b", None)]  # b: not Ready yet
    assert down == [("chat-v1-a", "http://h:1")]  # back: an instance without address is gone
