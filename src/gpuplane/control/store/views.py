"""What the API returns (and the CLI prints): pydantic views of jobs, clusters, nodes, teams,
tokens and secrets, and the bodies it takes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from gpuplane.control.bounds import MAX_SECONDS, bounded
from gpuplane.control.identity.auth import Role
from gpuplane.control.settings import TEAM_WEIGHT, ClusterConfig, QuotaValues


class ReasonView(BaseModel):
    cluster: str
    code: str
    message: str
    numbers: dict[str, int] = Field(default_factory=dict)


class EventView(BaseModel):
    """An entry of the trail (`GET /events`, a job's `timeline`)."""

    at: float
    kind: str
    message: str
    job_id: str | None = None
    cluster: str | None = None
    team: str | None = None
    actor: str | None = Field(default=None, description="a token's id or a JWT's subject")
    source: str | None = Field(default=None, description="the caller's address")
    status: int | None = Field(default=None, description="the HTTP status of the call")


class JobView(BaseModel):
    id: str
    name: str
    team: str
    state: str
    priority: int
    command: list[str]
    env: dict[str, Any] = Field(
        default_factory=dict, description="as submitted: a secret shows as its {secretRef: NAME}"
    )
    resources: dict[str, Any]
    selector: dict[str, Any]
    cluster: str | None = None
    node: str | None = None
    flavor: str | None = None
    devices: list[int] = Field(default_factory=list)
    reasons: list[ReasonView] = Field(default_factory=list)
    reason: ReasonView | None = Field(
        default=None,
        description="pending only: of `reasons`, the cluster where it came closest to fitting "
        "(what `job list` and `job describe` show first)",
    )
    queue_position: int | None = Field(
        default=None,
        description="pending only: 1 + pending jobs of higher priority, or equal and older "
        "(fair share between teams can reorder equals)",
    )
    message: str | None = None
    exit_code: int | None = None
    attempts: int = 0
    time_limit_s: float | None = Field(
        default=None, description="most seconds it may run on a card of speed 1.0; none: no limit"
    )
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    timeline: list[EventView] = Field(
        default_factory=list,
        description="one job only (not in lists): its events, oldest first: submitted, "
        "admitted, started, preempted, moved, finished, with their reasons",
    )


class DryRunView(BaseModel):
    """What submit would do now, without changing anything."""

    dry_run: bool = True
    fits: bool
    cluster: str | None = None
    node: str | None = None
    flavor: str | None = None
    devices: list[int] = Field(default_factory=list)
    preempts: list[str] = Field(default_factory=list)
    reasons: list[ReasonView] = Field(default_factory=list)
    queued_ahead: int = Field(description="pending jobs of equal or higher priority")


class DeviceView(BaseModel):
    index: int
    model: str
    mem_mib: int
    mem_free_mib: int
    gpu_milli_free: int
    uuid: str | None = None


class NodeView(BaseModel):
    cluster: str
    name: str
    labels: dict[str, str]
    cpu_millis: int
    cpu_free_millis: int
    memory_mib: int
    memory_free_mib: int
    devices: list[DeviceView]


class ClusterView(BaseModel):
    name: str
    adapter: str
    labels: dict[str, str]
    nodes: int
    gpus: int
    gpus_free: int = Field(description="wholly free cards")
    gpu_milli_free: int
    gpu_milli_used: int = Field(default=0, description="held by the slices of its jobs")
    slices_used: int = Field(default=0, description="cards or card slices its jobs hold")
    inventory: str = ""
    running_jobs: int = 0
    source: str = Field(
        default="config", description="config: gpuplane.yaml; api: added with `cluster add`"
    )
    version: str = Field(default="", description="the backend's version, as it reports it")
    health: str = Field(default="ok", description="ok, or unreachable")
    health_reason: str | None = Field(
        default=None, description="unreachable: why (what was tried and what answered)"
    )
    unreachable_at: float | None = Field(default=None, description="unreachable since")
    last_sync_at: float | None = Field(
        default=None, description="when it last answered with its inventory"
    )
    cordoned: bool = Field(default=False, description="nothing new is placed there")
    draining: bool = Field(default=False, description="cordoned, its jobs finishing or moved")


class ClusterDetail(ClusterView):
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="what is stored of a cluster added at run time (references, no secrets)",
    )
    node_list: list[NodeView]


class ClusterAdd(ClusterConfig):
    """Body of `POST /clusters`: a cluster as gpuplane.yaml declares one (`control.clusters`);
    a kubeconfig or address is a reference, read by the adapter, never stored in clear."""


class Drain(BaseModel):
    """What `POST /clusters/{name}/drain` did."""

    cluster: ClusterDetail
    requeued: list[str] = Field(description="jobs re-placed off the cluster")
    running: list[str] = Field(description="jobs left to finish there")


class QuotaView(BaseModel):
    flavor: str
    gpus: float
    gpu_mem_mib: int | None
    borrowing_limit_gpus: float | None
    borrowing_limit_mem_mib: int | None
    lending_limit_gpus: float | None = None
    lending_limit_mem_mib: int | None = None
    used_gpus: float
    used_gpu_mem_mib: int


class TeamView(BaseModel):
    name: str
    cohort: str | None
    weight: float
    limited: bool
    quotas: list[QuotaView]
    used_gpus: float
    used_gpu_mem_mib: int
    dominant_share: float
    pending_jobs: int = 0
    running_jobs: int = 0


class QuotaSet(QuotaValues):
    """Body of `PUT /teams/{team}/quotas/{flavor}`: the quota config's values, same ranges."""


class TeamSet(BaseModel):
    """Body of `PUT /teams/{team}`."""

    model_config = ConfigDict(extra="forbid")

    cohort: str | None = None
    weight: Annotated[float, TEAM_WEIGHT] = 1.0


class JobMove(BaseModel):
    """Body of `POST /jobs/{ref}/move`: the node to re-place the job on and, optionally, its new
    slice (the audit plan's); the job keeps its id and goes back to the queue pinned there."""

    model_config = ConfigDict(extra="forbid")

    cluster: str
    node: str
    gpu_mem_mib: Annotated[int, Field(ge=1)] | None = None
    gpu_cores_pct: Annotated[int, Field(ge=1, le=100)] | None = None
    reason: str = "moved by a user"


class TokenCreate(BaseModel):
    """Body of `POST /tokens`: a member's or viewer's token is for one team; an admin's may
    name none (admins act on every team)."""

    model_config = ConfigDict(extra="forbid")
    role: Role
    team: str | None = Field(default=None, max_length=63)
    name: str = Field(default="", max_length=63, description="what it is for (shown by list)")
    expires_in_s: Annotated[
        float | None, bounded(1, MAX_SECONDS, "seconds until it stops working")
    ] = None


class TokenView(BaseModel):
    id: str
    name: str
    team: str | None
    role: Role
    created_at: float
    expires_at: float | None
    revoked_at: float | None


class TokenCreated(TokenView):
    token: str = Field(description="the secret: shown this once, stored only as a keyed hash")


class SecretSet(BaseModel):
    """Body of `PUT /teams/{team}/secrets/{name}`."""

    model_config = ConfigDict(extra="forbid")
    value: str


class SecretView(BaseModel):
    team: str
    name: str
    updated_at: float
