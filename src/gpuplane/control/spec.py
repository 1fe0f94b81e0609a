"""Job specs (YAML) as users write them, validated, and their mapping to a scheduler request.

The minimal spec is a name, a team, a command and resources:

    name: hello
    team: research
    command: ["python", "-c", "print(42)"]
    resources: {gpu_mem_mib: 10240, gpu_cores_pct: 25}

`spread` (optional): a name shared by jobs that should not share a failure domain (a
deployment's instances of one version): the scheduler places each on the cluster, then the node,
holding the fewest jobs of its team with that name, where one fits; it never keeps a job pending.

`time_limit` (optional, like Slurm's `--time` or Kubernetes' `activeDeadlineSeconds`): the most
the job may run, in seconds or as a duration such as "2h", "90m", "1h30m", "45s"; on a card of
relative speed f (`gpu_speeds`, the `gpuplane.io/gpu-speed` label) it gets time_limit / f, so
the limit is stated once for a card of speed 1.0. A job still running at its limit is stopped
and fails with a message saying so. The scheduler uses limits to backfill around nominated
nodes and to weigh slow cards (`docs/architecture.md`).

An `env` value is a string, or a reference resolved only when the job starts, so no secret is
stored in the job or shown by `describe`: `{secretRef: NAME}` (a secret of the job's team,
`gpuplane secret set`) or `{fromEnv: NAME}` (the service's own variable, when
`control.auth.from_env` lists it).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuplane.control.bounds import (
    INT32_MAX,
    INT32_MIN,
    MAX_CARD_MEM_MIB,
    MAX_GPUS_PER_NODE,
    MAX_SECONDS,
    bounded,
)
from gpuplane.control.scheduler import Request
from gpuplane.errors import ResourceError, explain
from gpuplane.resources import LABEL_CLUSTER, LABEL_REGION, Resources, Selector, Slice

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")
_DURATION = re.compile(
    r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$"
)
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))  # the order _DURATION reads them
_DURATION_RULE = (
    "must be a positive duration: seconds (7200) or a string like '2h', '90m', '1h30m', '45s'"
)


_NAME_RULE = (
    "'{value}' must be 1-63 lowercase letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit"
)


def parse_duration(value: object) -> float:
    """Seconds from a number of seconds or a string like "2h", "90m", "1h30m", "1d", "45s" (a
    bare number in a string is seconds); raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{_DURATION_RULE}, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION.match(text)
            if not text or match is None:
                raise ValueError(f"{_DURATION_RULE}, got {value!r}") from None
            groups = zip(match.groups(), _UNITS, strict=True)
            seconds = sum(float(g) * size for g, (_, size) in groups if g)
    else:
        raise ValueError(f"{_DURATION_RULE}, got {value!r}")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{_DURATION_RULE}, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration the way `parse_duration` reads it: "2h", "1h30m", "45s", "1d2h"."""
    left = round(seconds)
    parts = []
    for unit, size in _UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or f"{seconds:g}s"


def check_name(what: str, value: str) -> str:
    """A team, cohort or job name; raises SpecError with the rule."""
    if not _NAME.match(value):
        raise SpecError(f"{what} name " + _NAME_RULE.format(value=value))
    return value


class SpecError(ResourceError):
    """A job spec is malformed; the message names the field and what is expected."""


class _StrictSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourcesSpec(_StrictSpec):
    gpus: Annotated[int, bounded(0, MAX_GPUS_PER_NODE, "whole cards on one node")] = 0
    gpu_mem_mib: Annotated[int | None, bounded(1, MAX_CARD_MEM_MIB, "vGPU: memory on one card")] = (
        None
    )
    gpu_cores_pct: Annotated[int | None, bounded(1, 100, "vGPU: compute % of one card")] = None
    cpu_millis: Annotated[int, bounded(0, INT32_MAX, "CPU (1000 = 1 core)")] = 0
    memory_mib: Annotated[int, bounded(0, INT32_MAX, "memory")] = 0


class SelectorSpec(_StrictSpec):
    match_labels: dict[str, str] = Field(default_factory=dict)
    gpu_models: list[str] = Field(default_factory=list, description="any of these GPU models")
    cluster: str | None = None
    region: str | None = None


class SecretRef(_StrictSpec):
    """An env value from a secret of the job's team."""

    secretRef: str = Field(min_length=1, max_length=63)


class FromEnv(_StrictSpec):
    """An env value from the service's environment (a name `control.auth.from_env` allows)."""

    fromEnv: str = Field(min_length=1, max_length=255)


EnvValue = str | SecretRef | FromEnv


class ServeSpec(_StrictSpec):
    """Marks a job as one instance of a deployment's version (the deployment controller sets it,
    `DeploymentSpec.to_job`): the version's deployment spec, from which an adapter that runs
    instances its own way builds them (Kubernetes: a KServe InferenceService), and the port the
    engine of the job's `command` listens on, where an adapter runs that command (`local`).
    The deployment spec is checked where a job is submitted (`intake.py`): the deployments
    package builds on this module, not the other way round."""

    port: Annotated[int, bounded(1, 65535, "the engine's port in `command`")]
    deployment: dict[str, Any] = Field(description="the version's deployment spec")


class JobSpec(_StrictSpec):
    name: str
    team: str
    command: list[str] = Field(min_length=1)
    env: dict[str, EnvValue] = Field(default_factory=dict)
    workdir: str | None = None
    priority: Annotated[
        int, bounded(INT32_MIN, INT32_MAX, "queue order: higher first (may be negative)")
    ] = 0
    resources: ResourcesSpec = ResourcesSpec()
    selector: SelectorSpec = SelectorSpec()
    time_limit: Annotated[
        float | None,
        bounded(1, MAX_SECONDS, "most seconds it may run on a card of speed 1.0 (or '2h')"),
    ] = None
    spread: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="jobs of the team with this name go to different clusters, then nodes, "
        "where capacity allows",
    )
    serve: ServeSpec | None = None

    @field_validator("time_limit", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float | None:
        return None if value is None else parse_duration(value)

    @field_validator("name", "team")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(_NAME_RULE.format(value=value))
        return value

    @field_validator("command", "env", "workdir")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # a C string ends at NUL: no process can be given one, so refuse it here, not at start
        if isinstance(value, dict):  # env: names and values (a reference holds a name)
            texts = [*value, *(v if isinstance(v, str) else _ref_name(v) for v in value.values())]
        else:  # command: a list; workdir: a string or None
            texts = [value] if isinstance(value, str) else value or []
        if any("\x00" in t for t in texts):
            raise ValueError("holds a NUL byte (\\x00), which no process can be given; remove it")
        return value

    def to_resources(self) -> Resources:
        r = self.resources
        return Resources(
            slice=Slice(gpus=r.gpus, gpu_mem_mib=r.gpu_mem_mib, gpu_cores_pct=r.gpu_cores_pct),
            cpu_millis=r.cpu_millis,
            memory_mib=r.memory_mib,
        )

    def to_selector(self) -> Selector:
        s = self.selector
        labels = dict(s.match_labels)
        if s.cluster:
            labels[LABEL_CLUSTER] = s.cluster
        if s.region:
            labels[LABEL_REGION] = s.region
        return Selector(match_labels=labels, gpu_models=frozenset(s.gpu_models))

    def to_request(self, job_id: str) -> Request:
        resources = self.to_resources()
        spread = spread_group(self.team, self.spread)
        return Request.from_resources(
            job_id, resources, self.to_selector(), self.time_limit, spread
        )


def spread_group(team: str, spread: object) -> str | None:
    """The scheduler's spread group of a job of `team` whose spec says `spread` (None: none):
    one team's names never spread another team's jobs."""
    return f"{team}/{spread}" if isinstance(spread, str) else None


def _ref_name(value: SecretRef | FromEnv) -> str:
    return value.secretRef if isinstance(value, SecretRef) else value.fromEnv


def env_refs(spec: JobSpec) -> tuple[list[str], list[str]]:
    """The secret names and the service's variable names `spec`'s env refers to."""
    secrets = [v.secretRef for v in spec.env.values() if isinstance(v, SecretRef)]
    names = [v.fromEnv for v in spec.env.values() if isinstance(v, FromEnv)]
    return secrets, names


def parse_spec(data: Any) -> JobSpec:
    """Validate a spec (a mapping from YAML or JSON); errors name each bad field."""
    if not isinstance(data, dict):
        raise SpecError(f"a job spec must be a mapping, got {type(data).__name__}")
    try:
        spec = JobSpec.model_validate(data)
        spec.to_request("validate")  # the shared vocabulary's own checks (e.g. gpus > 1 + slice)
    except ValidationError as exc:
        parts = [explain(e, JobSpec, noun="field", whole="spec") for e in exc.errors()]
        raise SpecError("invalid job spec: " + "; ".join(parts)) from None
    except ResourceError as exc:
        raise SpecError(f"invalid job spec: {exc}") from None
    return spec
