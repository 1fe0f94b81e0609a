"""Helpers for service tests: a service on a real store with a declared inventory, and checks."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, func, select, text

from gpuplane.control.adapters import ClusterAdapter, WorkloadState
from gpuplane.control.client import ADMIN_TOKEN_FILE
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import (
    ClusterConfig,
    ControlConfig,
    DeclaredGpus,
    DeclaredNode,
    TeamConfig,
)
from gpuplane.control.store.models import ACTIVE_STATES, Allocation, Device, Job
from gpuplane.control.store.store import MIGRATIONS, Store
from gpuplane.plane import control_app

A100 = "A100-80GB"
SLEEP = ["sleep", "30"]


def old_store(url: str, revision: str, *rows: str) -> Config:
    """Migrate the empty store at `url` only up to `revision` and insert `rows` (SQL): what an
    older gpuplane left behind. Returns the Alembic config that migrated it."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    engine = create_engine(url)
    try:
        migrate(engine, cfg, revision, *rows)
    finally:
        engine.dispose()
    return cfg


def migrate(engine: Engine, cfg: Config, revision: str, *rows: str, down: bool = False) -> None:
    """Upgrade (with `down`, downgrade) the store of `engine` to `revision`, then run `rows`."""
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
        for row in rows:
            conn.execute(text(row))


# A store at migration 0004 (before the milli-GPU columns were renamed): a team with a quota
# and a running job holding one card.
RUNNING_AT_0004 = (
    "INSERT INTO clusters (name, adapter, labels, created_at) VALUES ('c', 'local', '{}', 1.0)",
    "INSERT INTO nodes (id, cluster_name, name, labels, cpu_millis, memory_mib) "
    "VALUES (1, 'c', 'n', '{}', 1000, 1024)",
    "INSERT INTO devices (id, node_id, \"index\", model, mem_mib) VALUES (1, 1, 0, 'A100', 81920)",
    "INSERT INTO teams (name, cohort, weight) VALUES ('t', NULL, 1.0)",
    "INSERT INTO quotas (team_name, flavor, nominal_milli_gpus, borrowing_limit_milli_gpus, "
    "lending_limit_milli_gpus) VALUES ('t', 'A100', 2000, 500, 1000)",
    "INSERT INTO jobs (id, name, team_name, state, priority, spec, reasons, node_id, flavor, "
    "milli_gpus, gpu_mem_mib, cpu_millis, memory_mib, attempts, created_at) VALUES ('j', 'j', "
    "'t', 'running', 0, '{}', '{}', 1, 'A100', 1000, 81920, 0, 0, 0, 1.0)",
    "INSERT INTO allocations (job_id, device_id, mem_mib, gpu_milli) VALUES ('j', 1, 81920, 1000)",
)


def assert_gpu_milli_columns_renamed_in_place(url: str) -> None:
    """Migration 0005, as the store runs it (on SQLite with foreign keys on), renames the
    milli-GPU columns of a store holding a running job and keeps every row: the job's card
    stays allocated to it. Its downgrade gives the old names back with the same rows."""
    cfg = old_store(url, "0004", *RUNNING_AT_0004)
    store = Store(url)
    try:
        for revision, down in (("head", False), ("0004", True), ("head", False)):
            migrate(store.engine, cfg, revision, down=down)
            milli = "milli_gpus" if down else "gpu_milli"
            limits = ", ".join(
                f"{k}_{milli}" for k in ("nominal", "borrowing_limit", "lending_limit")
            )
            with store.engine.connect() as conn:
                assert conn.execute(text(f"SELECT id, {milli} FROM jobs")).all() == [("j", 1000)]
                assert conn.execute(text(f"SELECT {limits} FROM quotas")).all() == [
                    (2000, 500, 1000)
                ]
                allocations = text("SELECT job_id, device_id, gpu_milli FROM allocations")
                assert conn.execute(allocations).all() == [("j", 1, 1000)]
    finally:
        store.close()


def declared_node(name: str, gpus: int) -> DeclaredNode:
    """A node of `gpus` declared A100s, 64 cores and 512 GiB."""
    return DeclaredNode(
        name=name,
        cpu_millis=64_000,
        memory_mib=512 * 1024,
        gpus=[DeclaredGpus(model=A100, mem_mib=81920, count=gpus)],
    )


def local_cluster(name: str, gpus: int = 2, **settings: Any) -> ClusterConfig:
    """A `local` cluster of one node `<name>-n0` with `gpus` A100s; `settings`: the cluster's
    other fields (region, sync_interval_s, ...)."""
    nodes = [declared_node(f"{name}-n0", gpus)]
    return ClusterConfig(name=name, discover_gpus=False, nodes=nodes, **settings)


def config(
    state_dir: str,
    url: str | None = None,
    *,
    nodes: int = 1,
    gpus: int = 2,
    teams: Sequence[TeamConfig] = (TeamConfig(name="research"),),  # `job()`'s, no quotas
    clusters: Sequence[ClusterConfig] | None = None,
) -> ControlConfig:
    if clusters is None:
        declared = [declared_node(f"n{i}", gpus) for i in range(nodes)]
        clusters = [ClusterConfig(name="local", discover_gpus=False, nodes=declared)]
    return ControlConfig(
        state_dir=state_dir,
        database_url=url,
        clusters=list(clusters),
        teams=list(teams),
        kill_grace_s=2.0,
        # as root here, jobs would run as nobody, who cannot reach the test interpreter (under
        # /root); tests/control/test_job_privilege.py covers the switch
        allow_root_jobs=True,
        # every team as root: tests/control/test_team_isolation.py covers the refusal
        allow_shared_job_user=True,
    )


def make_service(cfg: ControlConfig, service_id: str | None = None) -> ControlService:
    if service_id is not None:
        cfg = cfg.model_copy(update={"service_id": service_id})
    service = ControlService(cfg)
    service.start()
    return service


def admin_token(service: ControlService) -> str:
    """The local admin token the service wrote to its state dir at start."""
    return (Path(service.config.state_dir) / ADMIN_TOKEN_FILE).read_text()


def api_client(service: ControlService, token: str | None = None) -> TestClient:
    """The API over `service` in-process (no background loop), on a loopback Host, as the
    service's local admin unless given another `token`; use it as a context manager."""
    return TestClient(
        control_app(service, background=False),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {token or admin_token(service)}"},
    )


def job(
    name: str, team: str = "research", command: list[str] | None = None, **resources: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "team": team,
        "command": command or SLEEP,
        "resources": resources,
    }
    return spec


def state(service: ControlService, job_id: str) -> Job:
    with service.store.session() as session:
        row = session.get(Job, job_id)
        assert row is not None
        return row


def wait_state(service: ControlService, job_id: str, *states: str, timeout_s: float = 120) -> Job:
    deadline = time.monotonic() + timeout_s
    while True:
        service.tick()
        row = state(service, job_id)
        if row.state in states:
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} is {row.state}, expected {states}")
        time.sleep(0.05)


def wait_done(adapter: ClusterAdapter, job_id: str) -> WorkloadState:
    """The state an adapter reports once the workload is no longer running (2 min at most)."""
    for _ in range(2400):  # up to 2 min on a loaded machine
        state = adapter.status([job_id])[job_id].state
        if state != WorkloadState.RUNNING:
            return state
        time.sleep(0.05)
    raise AssertionError(f"{job_id} still running")


def assert_no_device_over_allocated(service: ControlService) -> None:
    """Per card: memory and compute granted never exceed it; a whole card has one holder."""
    with service.store.session() as session:
        rows = session.execute(
            select(
                Device.id,
                Device.mem_mib,
                func.sum(Allocation.mem_mib),
                func.sum(Allocation.gpu_milli),
                func.count(Allocation.id),
            )
            .join(Allocation, Allocation.device_id == Device.id)
            .group_by(Device.id, Device.mem_mib)
        ).all()
        for _dev, cap, mem, milli, holders in rows:
            assert mem <= cap, f"device {_dev}: {mem} MiB granted of {cap}"
            assert milli <= 1000, f"device {_dev}: {milli} milli granted"
            assert holders >= 1
        orphans = session.scalar(
            select(func.count())
            .select_from(Allocation)
            .join(Job)
            .where(Job.state.not_in(ACTIVE_STATES))
        )
        assert orphans == 0, "a job that is not active still holds a device"


def submit_concurrently(
    services: Sequence[ControlService], specs: Sequence[dict[str, Any]], threads: int = 8
) -> list[str]:
    """Submit `specs` from `threads` threads spread over `services`; returns the job ids."""
    from concurrent.futures import ThreadPoolExecutor

    def one(k: int) -> str:
        out = services[k % len(services)].submit(specs[k])
        return str(out["id"])

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(len(specs))))


def assert_quota_respected(
    service: ControlService, limits: dict[str, tuple[int, int | None]]
) -> None:
    """Each team's admitted milli-GPUs stay within nominal + borrowing limit (team -> both)."""
    with service.store.session() as session:
        rows = session.execute(
            select(Job.team_name, func.sum(Job.gpu_milli))
            .where(Job.state.in_(ACTIVE_STATES))
            .group_by(Job.team_name)
        ).all()
    for team, used in rows:
        nominal, borrow = limits.get(team, (10**9, None))
        assert used <= nominal + (borrow if borrow is not None else 10**9), (team, used)


def least_privilege(
    tmp_path: Path, teams: Sequence[TeamConfig] | None = None, **update: object
) -> ControlConfig:
    """`config` under `tmp_path` (with `teams`, if given) with the privilege features' default,
    no root jobs, then `update` (the privilege and team isolation tests' base)."""
    state = str(tmp_path / "state")
    base = config(state) if teams is None else config(state, teams=teams)
    return base.model_copy(update={"allow_root_jobs": False, **update})
