"""The `control:` section of gpuplane.yaml: where the store lives, the clusters, teams and quotas.

Every field has an embedded default, so `gpuplane control serve` starts with no file at all:
a SQLite file under ./.gpuplane/ and one `local` cluster (this machine's GPUs, or two declared
80 GiB cards on a machine without any).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gpuplane.control.bounds import (
    INT32_MAX,
    MAX_CARD_MEM_MIB,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_SECONDS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    bounded,
)
from gpuplane.control.identity.config import LOOPBACK_HOSTS, AuthConfig, HttpConfig
from gpuplane.errors import unknown_name
from gpuplane.sections import Section, passes

# The cluster kinds this version implements, one module each under control/adapters/.
ADAPTER_KINDS = ("local", "kubernetes", "ray")
DEFAULT_GPU_MODEL = "A100-80GB"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DEFAULT_GPU_MEM_MIB = 80 * 1024


class DeclaredGpus(Section):
    """Cards of one model on a declared node (used when the machine has no GPU to discover)."""

    model: str = Field(default=DEFAULT_GPU_MODEL, description="GPU model (the quota flavor)")
    mem_mib: Annotated[int, bounded(1, MAX_CARD_MEM_MIB, "memory of one card")] = (
        DEFAULT_GPU_MEM_MIB
    )
    count: Annotated[int, bounded(1, MAX_GPUS_PER_NODE, "cards of this model on the node")] = 1


class DeclaredNode(Section):
    name: str = Field(description="node name, unique in its cluster")
    cpu_millis: Annotated[int, bounded(0, INT32_MAX, "allocatable CPU (1000 = 1 core)")] = 16_000
    memory_mib: Annotated[int, bounded(0, INT32_MAX, "allocatable memory")] = 64 * 1024
    labels: dict[str, str] = Field(default_factory=dict, description="free-form node labels")
    gpus: list[DeclaredGpus] = Field(default_factory=list, description="the node's cards")


class ClusterConfig(Section):
    """A cluster registered at start: its adapter, labels and (for `local`) declared inventory."""

    name: str = Field(description="cluster name (lowercase letters, digits, '-')")
    adapter: str = Field(default="local", description="cluster kind: local, kubernetes, ray")
    region: str = Field(default="local", description="the gpuplane.io/region label of its nodes")
    labels: dict[str, str] = Field(default_factory=dict, description="labels of every node")
    discover_gpus: bool = Field(
        default=True,
        description="local: read nvidia-smi; declared nodes are used when it finds none",
    )
    nodes: list[DeclaredNode] = Field(
        default_factory=list, description="declared inventory (local: when no GPU is found)"
    )
    kubeconfig: str | None = Field(
        default=None,
        description="kubernetes: path of the kubeconfig file (a reference: its credentials are "
        "read from there, never stored); unset: $KUBECONFIG or ~/.kube/config",
    )
    context: str | None = Field(
        default=None, description="kubernetes: kubeconfig context; unset: its current-context"
    )
    address: str | None = Field(
        default=None,
        description="ray: URL of the cluster's job API (the dashboard, e.g. "
        "http://127.0.0.1:8265); required for a ray cluster",
    )
    token_file: str | None = Field(
        default=None,
        description="ray: path of a file holding the cluster's auth token (Ray's token "
        "authentication; a reference: the token is read from there, never stored); unset: "
        "$RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token",
    )
    namespace: str = Field(
        default="gpuplane-{team}",
        description="kubernetes: namespace of a team's Pods ({team} is the team's name)",
    )
    bind_kind: Literal["pod", "job"] = Field(
        default="pod", description="kubernetes: a workload is a bare Pod or a batch/v1 Job"
    )
    image: str = Field(
        default="nvidia/cuda:12.4.1-base-ubuntu22.04",
        description="kubernetes: container image a job's command runs in",
    )
    scheduler_name: str = Field(
        default="hami-scheduler",
        description="kubernetes: schedulerName of the Pods (HAMi's scheduler assigns the card)",
    )
    grace_period_s: Annotated[
        int, bounded(0, 3600, "kubernetes: gracePeriodSeconds of a cancelled Pod")
    ] = 30
    sync_interval_s: Annotated[
        float,
        bounded(
            1,
            3600,
            "kubernetes: a watch silent this long is reopened; the API is "
            "unreachable after one interval without an answer (ray: the timeout of each call "
            "to its job API)",
        ),
    ] = 30.0

    @field_validator("adapter")
    @classmethod
    def _known_adapter(cls, kind: str) -> str:
        if kind not in ADAPTER_KINDS:
            raise ValueError(unknown_name("cluster adapter", kind, ADAPTER_KINDS))
        return kind

    @model_validator(mode="after")
    def _ray_address(self) -> ClusterConfig:
        if self.adapter == "ray" and not self.address:
            raise ValueError(
                f"cluster {self.name}: a ray cluster needs `address`, the URL of its job API "
                "(the dashboard, e.g. http://127.0.0.1:8265)"
            )
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace_template(cls, template: str) -> str:
        try:
            example = template.format(team="ml-research")
        except (KeyError, IndexError, ValueError):
            raise ValueError(
                f"{template!r} may name only {{team}} (e.g. 'gpuplane-{{team}}')"
            ) from None
        if not _DNS_LABEL.fullmatch(example):
            raise ValueError(
                f"{template!r} gives {example!r} for team 'ml-research', not a namespace name "
                "(lowercase letters, digits and '-', at most 63)"
            )
        return template


class QuotaValues(Section):
    """Nominal quota, borrowing and lending limits on one ResourceFlavor (the API's quota body)."""

    gpus: Annotated[
        float, bounded(0, MAX_GPUS, "nominal GPUs (fractions count as shares of a card)")
    ]
    gpu_mem_mib: Annotated[
        int | None, bounded(0, INT32_MAX, "nominal GPU memory; unset: no limit")
    ] = None
    borrowing_limit_gpus: Annotated[
        float | None, bounded(0, MAX_GPUS, "most GPUs borrowed from the cohort; unset: no limit")
    ] = None
    borrowing_limit_mem_mib: Annotated[
        int | None, bounded(0, INT32_MAX, "most GPU memory borrowed; unset: no limit")
    ] = None
    lending_limit_gpus: Annotated[
        float | None,
        bounded(0, MAX_GPUS, "most of the nominal quota the cohort may borrow; unset: all"),
    ] = None
    lending_limit_mem_mib: Annotated[
        int | None, bounded(0, INT32_MAX, "most GPU memory the cohort may borrow; unset: all")
    ] = None


class QuotaConfig(QuotaValues):
    """Nominal quota of one team on one ResourceFlavor (a GPU model), Kueue-style."""

    flavor: str = Field(description="GPU model (ResourceFlavor) the quota is for")


TEAM_WEIGHT = bounded(MIN_WEIGHT, MAX_WEIGHT, "fair-share weight")


class TeamConfig(Section):
    """A team, and what of it the file sets: each of cohort, weight and quotas that the entry
    states is applied at every start and refused through the API (which would be undone);
    what it leaves out, the API sets and a restart keeps."""

    name: str = Field(description="team (its LocalQueue and ClusterQueue take this name)")
    cohort: str | None = Field(default=None, description="teams of a cohort lend unused quota")
    weight: Annotated[float, TEAM_WEIGHT] = 1.0
    quotas: list[QuotaConfig] = Field(
        default_factory=list,
        description="per GPU model; none: the team is not limited; left out: set by the API",
    )

    def states(self, field: str) -> bool:
        """Whether this entry sets `field` (cohort, weight or quotas): the file then owns it."""
        return field in self.model_fields_set


def _default_clusters() -> list[ClusterConfig]:
    return [ClusterConfig(name="local")]


class ControlConfig(Section):
    # "instance" is a serving process (glossary): the process's id is `service_id`
    renamed: ClassVar[Mapping[str, str]] = {"instance": "service_id"}
    host: str = Field(default="127.0.0.1", description="the API listens here")
    port: Annotated[int, bounded(0, 65535, "the API's port")] = 8080
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: sqlite:///<state_dir>/control.db"
    )
    state_dir: str = Field(default=".gpuplane", description="SQLite file, job logs")
    policy: str | None = Field(
        default=None, description="scheduling policy; default: the core's best"
    )
    schedule_interval_s: Annotated[
        float, bounded(0.01, 3600, "period of the loop that observes jobs, admits and binds")
    ] = 0.5
    default_gpu_model: str = Field(
        default=DEFAULT_GPU_MODEL, description="declared cards of a local cluster with no GPU"
    )
    default_gpu_mem_mib: Annotated[int, bounded(1, MAX_CARD_MEM_MIB, "their memory")] = (
        DEFAULT_GPU_MEM_MIB
    )
    default_gpu_count: Annotated[int, bounded(0, MAX_GPUS_PER_NODE, "how many are declared")] = 2
    clusters: list[ClusterConfig] = Field(
        default_factory=_default_clusters, description="default: one cluster `local`"
    )
    teams: list[TeamConfig] = Field(
        default_factory=list, description="teams and quotas applied at start (others: via API)"
    )
    default_team: str | None = Field(
        default=None,
        description="the team of a job spec that names none (one of `teams`); unset: every "
        "spec names its team. A job naming an undeclared team is refused either way",
    )
    nominate_after_s: Annotated[
        float,
        bounded(
            1,
            MAX_SECONDS,
            "a job that waited this long (since submit) and does not fit gets a node "
            "nominated: nothing new lands on what it needs there until it runs",
        ),
    ] = 3600.0
    max_nominations: Annotated[
        int, bounded(0, 10_000, "node nominations held at once (0: none)")
    ] = 2
    wait_for_faster_gpu: bool = Field(
        default=True,
        description="a job the policy would start on a slower GPU model waits for a faster one "
        "it may use when that is expected to free room for it before the slower card would "
        "finish it (no runtime estimates: from completed jobs and the queue ahead of it)",
    )
    longest_first: bool = Field(
        default=True,
        description="within a priority, jobs whose time limit reaches past the backlog's "
        "horizon start first, longest first (shortens the makespan; it trusts the limits users "
        "state, so turn it off where they are inflated to jump the queue)",
    )
    kill_grace_s: Annotated[float, bounded(0, 3600, "SIGTERM to SIGKILL on cancel")] = 5.0
    job_user: str | None = Field(
        default=None,
        description="local: the one unprivileged user a service running as root starts every "
        "team's jobs as; unset: each team its own uid (team_uid_start) (a service that is not "
        "root runs jobs as its own user and refuses this setting)",
    )
    allow_root_jobs: bool = Field(
        default=False,
        description="local: a service running as root may run jobs as root (when job_user is "
        "unset); otherwise it runs them as their team's own uid (team_uid_start)",
    )
    team_uid_start: Annotated[
        int,
        bounded(
            1000,
            4_000_000_000,
            "local, service as root: the first uid (and gid) of the range each team's jobs "
            "get a uid of their own from, in the order teams first run a job here; no user of "
            "this machine may hold one (like /etc/subuid, give each service its own range)",
        ),
    ] = 1_900_000_000
    team_uid_count: Annotated[
        int, bounded(1, 1_000_000, "local: how many uids from team_uid_start teams may take")
    ] = 65536
    allow_shared_job_user: bool = Field(
        default=False,
        description="local: jobs of different teams may run at the same time as one user "
        "(service not root, job_user or root jobs), able to read each other's environment "
        "and signal each other; otherwise a second team's job is refused while another "
        "team's run there",
    )
    job_containment: Literal["auto", "cgroup", "subreaper"] = Field(
        default="auto",
        description="local: how a job's every process is found and stopped at cancel, time "
        "limit and release: a cgroup v2 of its own (which also enforces its memory and CPU), "
        "or its wrapper as a subreaper (no limits); auto: cgroup where the service can "
        "create one (cgroup_parent), else subreaper, said at start",
    )
    cgroup_parent: str | None = Field(
        default=None,
        description="local: the cgroup v2 directory jobs' cgroups are made under (a "
        "delegated one, e.g. systemd's Delegate=yes); unset: gpuplane-jobs under the "
        "service's own cgroup in the cgroup2 mount",
    )
    auth: AuthConfig = Field(default_factory=AuthConfig, description="tokens, hosts, OIDC")
    http: HttpConfig = Field(default_factory=HttpConfig, description="body limits, proxies")
    events_retention_s: Annotated[
        float, bounded(3600, MAX_SECONDS, "the trail keeps events this long (default 90 days)")
    ] = 90 * 86400.0
    samples_dir: str | None = Field(
        default=None,
        description="an audit sample store (`gpuplane audit collect --out DIR`): adds used and "
        "idle GPU-hours to `GET /usage` and used GPUs to the console's history; unset: "
        "allocations only",
    )
    runs_dirs: dict[str, str] = Field(
        default_factory=dict,
        description="team -> the directory its batch runs are written under (its "
        "batch.runs_dir): the console lists those runs and their reports to that team",
    )
    service_id: str | None = Field(
        default=None,
        description="the id of this control-plane process: it observes the jobs it started; "
        "default host:port (a restart takes its jobs back)",
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str | None) -> str | None:
        if name is not None:
            # the scheduler core needs the `control` extra; only a config that names a policy
            # imports it here
            from gpuplane.control.scheduler import policy_class

            return passes(policy_class, name)
        return name

    @model_validator(mode="after")
    def _unique(self) -> ControlConfig:
        for what, names in (
            ("cluster", [c.name for c in self.clusters]),
            ("team", [t.name for t in self.teams]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{what} names must be unique; repeated: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _default_team_declared(self) -> ControlConfig:
        names = [t.name for t in self.teams]
        if self.default_team is not None and self.default_team not in names:
            raise ValueError(
                "default_team: "
                + unknown_name("team", self.default_team, names)
                + "; declare it under control.teams (a team needs no quotas)"
            )
        return self

    @model_validator(mode="after")
    def _hosts_beyond_loopback(self) -> ControlConfig:
        if self.host not in LOOPBACK_HOSTS and self.auth.allowed_hosts is None:
            raise ValueError(
                f"host {self.host} listens beyond loopback, and no auth section says who may "
                "call it: set control.auth.allowed_hosts to the names clients reach it by "
                "(every request then needs a bearer token: the admin token the service writes "
                "to its state dir, tokens from `gpuplane token create`, or control.auth.oidc)"
            )
        return self

    def served_hosts(self) -> list[str]:
        """The Host header values the API answers."""
        if self.auth.allowed_hosts is not None:
            return self.auth.allowed_hosts
        return list(LOOPBACK_HOSTS)

    def on_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir}/control.db"
