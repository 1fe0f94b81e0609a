"""The cluster adapter interface, the data it speaks, and the registry of adapters by kind.

The service calls an adapter in this order: `inventory()` when the cluster is registered or
refreshed; `bind(workload)` after a placement is committed; `status(job_ids)` on every reconcile
tick; `release(job_id)` when a job is cancelled, preempted or has ended; `logs(job_id)` on demand;
`reachable()` on every tick of the health check (`clusters.py`), which also calls `inventory()`
once a sync interval.
`workloads()` lists what it holds, so the reconciler can stop workloads whose job was cancelled
or preempted by another service process. `bind` is idempotent per job id and `release` is
idempotent and never raises, so a crash between
the store's commit and the adapter's call can always be repaired by calling again.

Workloads outlive the service process: a service restarted under the same `control.service_id`
creates its adapters again and calls `workloads()` and `status()` before anything else (its first
reconcile, in `ControlService.start`); they answer for the workloads the earlier process bound
too, and `bind` of such a job takes it back rather than starting it twice. `close()` is only for
a shutdown that stops the jobs (`control serve --stop-jobs`, tests). A Kubernetes
adapter maps a workload to a Pod with HAMi resource limits, a Ray adapter to a task with
fractional `num_gpus`; the `local` adapter runs a process on this machine.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig, ControlConfig
from gpuplane.engines.base import LaunchSpec
from gpuplane.errors import GpuplaneError


class AdapterError(GpuplaneError):
    """A cluster backend refused or failed an operation; the message says which and why."""


@dataclass(frozen=True, slots=True)
class DiscoveredDevice:
    index: int
    model: str
    mem_mib: int
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class DiscoveredNode:
    name: str
    cpu_millis: int
    memory_mib: int
    labels: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DiscoveredDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class Inventory:
    """Nodes and their cards, and where the adapter learnt them (said at start)."""

    nodes: tuple[DiscoveredNode, ...]
    source: str


@dataclass(frozen=True, slots=True)
class InventoryChange:
    """What changed in a cluster's inventory since the adapter was last asked: each changed node
    as it is now, and the names of the nodes gone (deleted, cordoned, not Ready)."""

    nodes: tuple[DiscoveredNode, ...] = ()
    gone: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Serving:
    """A deployment instance as a cluster that serves it itself runs it (Kubernetes: KServe's
    InferenceService): the engine's `launch` listening on every address at `port` (its
    `engine_args` appended; the model as the spec names it), what the container declares, and
    the spec's placement labels. Built by the control plane at bind (`DeploymentSpec.serving`),
    so an adapter never reads a deployment spec."""

    engine: str
    model: str
    launch: LaunchSpec
    port: int
    max_concurrency: int | None = None
    limits: Mapping[str, str] = field(default_factory=dict)  # HAMi's card names, cpu, memory
    match_labels: Mapping[str, str] = field(default_factory=dict)
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Workload:
    """One admitted job, as an adapter starts it: what to run and the devices it holds.
    `time_limit_s`: wall-clock seconds it may run (the spec's limit at its node's GPU speed);
    past that `status` reports it TIMED_OUT (Kubernetes: `activeDeadlineSeconds`) and the
    service's `release` stops it."""

    job_id: str
    name: str
    command: tuple[str, ...]
    node: str
    devices: tuple[DeviceGrant, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    fractional: bool = False
    time_limit_s: float | None = None
    team: str | None = None  # the job's team (Kubernetes: it picks the namespace)
    serve: Serving | None = None  # a deployment instance: how a cluster serving it runs it


class WorkloadState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"  # the backend no longer knows the workload (e.g. the service restarted)
    TIMED_OUT = "timed_out"  # still running at its time limit: the service stops it


@dataclass(frozen=True, slots=True)
class WorkloadStatus:
    state: WorkloadState
    exit_code: int | None = None
    message: str = ""
    url: str | None = None  # a deployment instance's address, once the backend gave it one


class ClusterAdapter:
    """Base of every cluster adapter. Subclasses set `kind` and implement the five methods."""

    kind: ClassVar[str] = ""
    # what this kind cannot do, with the reason (capabilities as data; refused before any I/O)
    unsupported: ClassVar[Mapping[str, str]] = {}

    def __init__(self, cluster: ClusterConfig, control: ControlConfig) -> None:
        self.cluster = cluster
        self.control = control

    @property
    def state_dir(self) -> Path:
        return Path(self.control.state_dir) / "clusters" / self.cluster.name

    def inventory(self) -> Inventory:
        """Nodes and devices of the cluster now."""
        raise NotImplementedError

    def changes(self) -> InventoryChange | None:
        """What changed in `inventory()` since the last call, for a syncer to write only that
        (`inventory.sync_nodes`); None when the whole inventory must be written (`sync_cluster`):
        always, for an adapter that does not watch its cluster (the default); the first time,
        and after each relist, for one that does."""
        return None

    def bind(self, workload: Workload) -> None:
        """Start `workload` on its node and devices. Idempotent per job id, across restarts of
        the service too; raises AdapterError saying what was wrong."""
        raise NotImplementedError

    def status(self, job_ids: Iterable[str]) -> dict[str, WorkloadStatus]:
        """The state of each bound workload in `job_ids` (LOST for any the backend forgot)."""
        raise NotImplementedError

    def release(self, job_id: str) -> None:
        """Stop `job_id` if it runs and forget it. Idempotent; never raises."""
        raise NotImplementedError

    def workloads(self) -> list[str]:
        """Job ids this adapter has bound and not yet released (the reconciler stops strays)."""
        raise NotImplementedError

    def logs(self, job_id: str, tail: int | None = None, since: int = 0) -> Iterator[bytes]:
        """The workload's output so far from byte `since` (or its last `tail` lines), in blocks
        of bounded size, so the API streams it; none when there is none."""
        raise NotImplementedError

    def close(self) -> None:
        """Release every workload this adapter still runs (a shutdown that stops the jobs)."""

    def reachable(self) -> tuple[bool, str]:
        """Whether the backend answered lately, and if not, why; the service's health check
        asks on every tick, so it must not block. The default (an adapter whose calls fail on
        their own): yes, and the check's `inventory()` once a sync interval tells otherwise."""
        return True, ""

    def serving_refusal(self) -> str | None:
        """Why this cluster cannot run deployment instances (None: it can); the controller
        asks before it accepts a deployment that could be placed here. The default: an adapter
        that gives an instance no address the gateway can reach."""
        return (
            f"cluster {self.cluster.name} ({self.kind}) gives an engine no address the gateway "
            "can reach"
        )

    def instance_url(self, job_id: str, port: int) -> str | None:
        """Where deployment instance `job_id` answers, once it is known (None: not yet);
        `port`: the one its command's engine was given. The default: the URL `status` reports."""
        found = self.status([job_id]).get(job_id)
        return None if found is None else found.url

    def version(self) -> str:
        """The backend's version as it reports it (e.g. `v1.29.3`); empty when unknown."""
        return ""


_REGISTRY: dict[str, type[ClusterAdapter]] = {}


def register(cls: type[ClusterAdapter]) -> type[ClusterAdapter]:
    """Class decorator: make an adapter available under `cls.kind`."""
    _REGISTRY[cls.kind] = cls
    return cls


def create_adapter(cluster: ClusterConfig, control: ControlConfig) -> ClusterAdapter:
    """The adapter for `cluster.adapter`, one of `ADAPTER_KINDS` (the settings refuse others)."""
    kind = cluster.adapter
    if kind not in _REGISTRY:
        importlib.import_module(f"gpuplane.control.adapters.{kind}")
    return _REGISTRY[kind](cluster, control)
