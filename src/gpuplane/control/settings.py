"""The `control:` section of gpuplane.yaml: where the store lives, the clusters, teams and quotas.

Every field has an embedded default, so `gpuplane control serve` starts with no file at all:
a SQLite file under ./.gpuplane/ and one `local` cluster (this machine's GPUs, or two declared
80 GiB cards on a machine without any).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_GPU_MODEL = "A100-80GB"
DEFAULT_GPU_MEM_MIB = 80 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeclaredGpus(_Section):
    """Cards of one model on a declared node (used when the machine has no GPU to discover)."""

    model: str = DEFAULT_GPU_MODEL
    mem_mib: int = Field(default=DEFAULT_GPU_MEM_MIB, ge=1)
    count: int = Field(default=1, ge=1)


class DeclaredNode(_Section):
    name: str
    cpu_millis: int = Field(default=16_000, ge=0)
    memory_mib: int = Field(default=64 * 1024, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[DeclaredGpus] = Field(default_factory=list)


class ClusterConfig(_Section):
    """A cluster registered at start: its adapter, labels and (for `local`) declared inventory."""

    name: str
    adapter: str = "local"
    region: str = "local"
    labels: dict[str, str] = Field(default_factory=dict)
    discover_gpus: bool = Field(
        default=True,
        description="local: read nvidia-smi; declared nodes are used when it finds none",
    )
    nodes: list[DeclaredNode] = Field(default_factory=list)


class QuotaConfig(_Section):
    """Nominal quota of one team on one ResourceFlavor (a GPU model), Kueue-style."""

    flavor: str
    gpus: float = Field(ge=0, description="nominal GPUs (fractions count as shares of a card)")
    gpu_mem_mib: int | None = Field(
        default=None, ge=0, description="nominal GPU memory; unset: no limit"
    )
    borrowing_limit_gpus: float | None = Field(default=None, ge=0, description="unset: no limit")
    borrowing_limit_mem_mib: int | None = Field(default=None, ge=0)
    lending_limit_gpus: float | None = Field(
        default=None,
        ge=0,
        description="most of the nominal quota the cohort may borrow; unset: all",
    )
    lending_limit_mem_mib: int | None = Field(default=None, ge=0)


class TeamConfig(_Section):
    name: str
    cohort: str | None = None
    weight: float = Field(default=1.0, gt=0, description="fair-share weight")
    quotas: list[QuotaConfig] = Field(default_factory=list)


def _default_clusters() -> list[ClusterConfig]:
    return [ClusterConfig(name="local")]


class ControlConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: sqlite:///<state_dir>/control.db"
    )
    state_dir: str = Field(default=".gpuplane", description="SQLite file, job logs")
    policy: str | None = Field(
        default=None, description="scheduling policy; default: the core's best"
    )
    schedule_interval_s: float = Field(default=0.5, gt=0)
    default_gpu_model: str = DEFAULT_GPU_MODEL
    default_gpu_mem_mib: int = Field(default=DEFAULT_GPU_MEM_MIB, ge=1)
    default_gpu_count: int = Field(default=2, ge=0)
    clusters: list[ClusterConfig] = Field(default_factory=_default_clusters)
    teams: list[TeamConfig] = Field(default_factory=list)
    kill_grace_s: float = Field(default=5.0, ge=0, description="SIGTERM to SIGKILL on cancel")
    instance: str | None = Field(
        default=None,
        description="name of this service process: it observes the jobs it started; "
        "default host:port (a restart takes its jobs back)",
    )

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

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir}/control.db"
