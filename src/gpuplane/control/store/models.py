"""SQLAlchemy 2 tables of the control plane's store.

Clusters hold nodes, nodes hold devices (GPUs). Teams own Kueue-style quotas per flavor (GPU
model). Jobs carry their spec, state and pending reasons; allocations bind a running job to the
devices it holds; events are the audit trail. API tokens are kept as keyed hashes, a team's
secrets encrypted. `scheduler_lock` is one row that every placement
transaction updates first, which serialises commits on SQLite and PostgreSQL alike.
Times are seconds since the epoch (float), from the service's injected clock.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

JOB_STATES = ("pending", "admitted", "running", "succeeded", "failed", "cancelled")
ACTIVE_STATES = ("admitted", "running")
FINAL_STATES = ("succeeded", "failed", "cancelled")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Cluster(Base):
    """A cluster in the pool. `source`: `config` (gpuplane.yaml, registered at start) or `api`
    (`cluster add`: its `settings` are stored, references only: a kubeconfig path and context,
    an address, never credentials). Cordoned, draining or unreachable: nothing new is placed
    there; `unreachable` says why (None: it answered within its sync interval)."""

    __tablename__ = "clusters"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    adapter: Mapped[str] = mapped_column(String(32))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16), default="config")
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    inventory: Mapped[str] = mapped_column(String(2000), default="")  # where it was learnt
    version: Mapped[str] = mapped_column(String(63), default="")  # the backend's own
    unreachable: Mapped[str | None] = mapped_column(String(2000), default=None)
    unreachable_since: Mapped[float | None] = mapped_column(Float, default=None)
    last_sync_at: Mapped[float | None] = mapped_column(Float, default=None)
    nodes: Mapped[list[Node]] = relationship(
        back_populates="cluster", cascade="all, delete-orphan", order_by="Node.name"
    )


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster_name", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_name: Mapped[str] = mapped_column(ForeignKey("clusters.name", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(253))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    cpu_millis: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(Integer)
    cluster: Mapped[Cluster] = relationship(back_populates="nodes")
    devices: Mapped[list[Device]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="Device.index"
    )


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("node_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(63))
    mem_mib: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str | None] = mapped_column(String(64), default=None)
    node: Mapped[Node] = relationship(back_populates="devices")


class Team(Base):
    """A team submits through its LocalQueue into its own ClusterQueue (both named after it)."""

    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    cohort: Mapped[str | None] = mapped_column(String(63), default=None)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    quotas: Mapped[list[Quota]] = relationship(
        back_populates="team", cascade="all, delete-orphan", order_by="Quota.flavor"
    )


class Quota(Base):
    """Nominal quota, borrowing and lending limits of one team on one flavor (milli-GPUs)."""

    __tablename__ = "quotas"

    team_name: Mapped[str] = mapped_column(
        ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True
    )
    flavor: Mapped[str] = mapped_column(String(63), primary_key=True)
    nominal_gpu_milli: Mapped[int] = mapped_column(Integer)
    nominal_mem_mib: Mapped[int | None] = mapped_column(Integer, default=None)
    borrowing_limit_gpu_milli: Mapped[int | None] = mapped_column(Integer, default=None)
    borrowing_limit_mem_mib: Mapped[int | None] = mapped_column(Integer, default=None)
    lending_limit_gpu_milli: Mapped[int | None] = mapped_column(Integer, default=None)
    lending_limit_mem_mib: Mapped[int | None] = mapped_column(Integer, default=None)
    team: Mapped[Team] = relationship(back_populates="quotas")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_state_priority", "state", "priority"),)

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    team_name: Mapped[str] = mapped_column(ForeignKey("teams.name"))
    state: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[dict[str, Any]] = mapped_column()
    reasons: Mapped[dict[str, Any]] = mapped_column(default=dict)
    cluster_name: Mapped[str | None] = mapped_column(String(63), default=None)
    node_id: Mapped[int | None] = mapped_column(
        ForeignKey("nodes.id", ondelete="SET NULL"), default=None
    )
    # card indices on the node of its last placement; kept when it ends and its allocations go
    devices: Mapped[list[Any] | None] = mapped_column(default=None)
    flavor: Mapped[str | None] = mapped_column(String(63), default=None)
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    gpu_mem_mib: Mapped[int] = mapped_column(Integer, default=0)
    cpu_millis: Mapped[int] = mapped_column(Integer, default=0)
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str | None] = mapped_column(String(2000), default=None)
    bound_by: Mapped[str | None] = mapped_column(String(255), default=None)  # service instance
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # most seconds it may run on a card of speed 1.0 (the spec's time_limit); None: no limit
    time_limit_s: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, default=None)
    finished_at: Mapped[float | None] = mapped_column(Float, default=None)
    allocations: Mapped[list[Allocation]] = relationship(
        back_populates="job", cascade="all, delete-orphan"
    )


class Allocation(Base):
    """One device held by one admitted or running job; deleted when the job releases it."""

    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"), index=True)
    mem_mib: Mapped[int] = mapped_column(Integer)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    job: Mapped[Job] = relationship(back_populates="allocations")


class Event(Base):
    """One entry of the trail: a job's step (submitted, admitted, started, ...; its team is the
    job's) or a call that changed something (kind `api`: who, from where, for which team, with
    what HTTP status)."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(80), index=True, default=None)
    cluster_name: Mapped[str | None] = mapped_column(String(63), default=None)
    message: Mapped[str] = mapped_column(String(2000))
    team_name: Mapped[str | None] = mapped_column(String(63), default=None)
    actor: Mapped[str | None] = mapped_column(String(255), default=None)  # token id, JWT sub
    source: Mapped[str | None] = mapped_column(String(255), default=None)  # client address
    status: Mapped[int | None] = mapped_column(Integer, default=None)  # HTTP status


class ApiToken(Base):
    """An API token: its role and team, and an HMAC of the secret (never the secret itself)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # the token's public part
    name: Mapped[str] = mapped_column(String(63))
    team_name: Mapped[str | None] = mapped_column(String(63), default=None)  # None: admin
    role: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, default=None)
    revoked_at: Mapped[float | None] = mapped_column(Float, default=None)


class Secret(Base):
    """A team's secret, encrypted with the service's key (Fernet); jobs refer to it by name."""

    __tablename__ = "secrets"

    team_name: Mapped[str] = mapped_column(
        ForeignKey("teams.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    ciphertext: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


class SchedulerLock(Base):
    __tablename__ = "scheduler_lock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class Deployment(Base):
    """A deployed model (`control/deployments/`): its spec as applied, and whether it is being
    deleted (its instances drain first; the row goes when the last one has stopped)."""

    __tablename__ = "deployments"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column()
    deleting: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class DeploymentInstance(Base):
    """One engine instance of a deployment's version: the job that runs it and where it
    answers (`url`: None until its cluster says, e.g. once KServe reports its InferenceService
    Ready). `capacity` is its slots: the spec's `max_concurrency`, else None until its engine
    reports them. `draining_since` is set once it is no longer wanted: the gateway stops
    admitting to it, and its job is stopped `drain_timeout_s` later."""

    __tablename__ = "deployment_instances"

    job_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    deployment: Mapped[str] = mapped_column(
        ForeignKey("deployments.name", ondelete="CASCADE"), index=True
    )
    version: Mapped[str] = mapped_column(String(63))
    url: Mapped[str | None] = mapped_column(String(255), nullable=True)
    capacity: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    draining_since: Mapped[float | None] = mapped_column(Float, default=None)


class DeploymentEvent(Base):
    __tablename__ = "deployment_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    deployment: Mapped[str] = mapped_column(String(63), index=True)
    message: Mapped[str] = mapped_column(String(2000))
