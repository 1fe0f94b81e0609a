"""Trace replay of the FGD paper's packing protocol (openb), through the live scheduler core.

Protocol (docs/architecture.md, after Weng et al., USENIX ATC'23):
1. cluster = the trace's nodes (CPU, memory and cards all count);
2. arrivals (the paper's workload) = all pods, plus copies drawn at random (with replacement)
   appended while the total GPU request stays within `tune` x the cluster's GPU capacity; then
   shuffled; one seed per run;
3. pods are placed one at a time in that order with `schedule` + `Snapshot.commit`, no
   departures; a pod that fits nowhere fails (its reason code is counted);
4. the GPU allocation ratio (allocated milli / capacity) is recorded when the arrived GPU demand
   (placed or failed) first reaches 100 % and at the end (130 % for tune 1.3).

Mapping of the trace to scheduler requests: `num_gpu == 1` and `gpu_milli < 1000` is a fractional
request of `gpu_milli` compute whose GPU memory is the same share of the card it lands on;
otherwise `num_gpu` whole cards; `gpu_spec` becomes a selector on the GPU-model label.
"""

from __future__ import annotations

import csv
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuplane.control.scheduler import (
    MILLI_PER_GPU,
    Decision,
    DeviceInfo,
    NodeInfo,
    Policy,
    Request,
    Snapshot,
    explain,
    policy_class,
    schedule,
)
from gpuplane.errors import ConfigError, ResourceError
from gpuplane.resources import LABEL_GPU_MODEL, Selector

# GPU memory per card by trace model (G1-G3 are undisclosed); only proportions matter here.
CARD_MEM_MIB = {"P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
DEFAULT_CARD_MEM_MIB = 32768
TRACE_CLUSTER = "openb"


def load_nodes(path: Path | str) -> list[NodeInfo]:
    """openb node list (sn, cpu_milli, memory_mib, gpu, model) to scheduler nodes."""
    nodes = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"]
            mem = CARD_MEM_MIB.get(model, DEFAULT_CARD_MEM_MIB)
            nodes.append(
                NodeInfo(
                    name=row["sn"],
                    cluster=TRACE_CLUSTER,
                    cpu_millis=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    devices=tuple(DeviceInfo(i, mem) for i in range(int(row["gpu"]))),
                    labels={LABEL_GPU_MODEL: model},
                )
            )
    if not nodes:
        raise ResourceError(f"{path}: no nodes")
    return nodes


def load_pods(path: Path | str) -> list[Request]:
    """openb pod list (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, ...)."""
    pods = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            spec = frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m)
            fractional = gpus == 1 and milli < MILLI_PER_GPU
            pods.append(
                Request(
                    job_id=row["name"],
                    gpus=0 if fractional else gpus,
                    gpu_milli=milli if fractional else 0,
                    cpu_millis=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    selector=Selector(gpu_models=spec) if gpus and spec else Selector(),
                )
            )
    if not pods:
        raise ResourceError(f"{path}: no pods")
    return pods


def tuned_pods(
    pods: Sequence[Request], capacity_milli: int, tune: float, rng: np.random.Generator
) -> list[Request]:
    """All pods, plus random copies while the GPU demand stays within tune x capacity; shuffled."""
    out = list(pods)
    total = sum(p.gpu_demand_milli for p in pods)
    target = tune * capacity_milli
    i = 0
    while True:
        p = pods[int(rng.integers(len(pods)))]
        if total + p.gpu_demand_milli > target:
            break
        total += p.gpu_demand_milli
        out.append(
            Request(
                f"{p.job_id}-tuned-{i}",
                p.gpus,
                p.gpu_milli,
                p.gpu_mem_mib,
                p.cpu_millis,
                p.memory_mib,
                p.selector,
            )
        )
        i += 1
    order = rng.permutation(len(out))
    return [out[j] for j in order]


@dataclass(slots=True)
class SeedResult:
    seed: int
    pods: int
    placed: int
    alloc_ratio_100: float  # percent
    alloc_ratio_final: float  # percent, at the end (= 130 % demand for tune 1.3)
    failures: dict[str, int]
    seconds: float


@dataclass(slots=True)
class SimulationResult:
    policy: str
    tune: float
    seeds: list[SeedResult] = field(default_factory=list)

    @property
    def alloc_ratio_100(self) -> float:
        return float(np.mean([s.alloc_ratio_100 for s in self.seeds]))

    @property
    def alloc_ratio_final(self) -> float:
        return float(np.mean([s.alloc_ratio_final for s in self.seeds]))

    @property
    def failures(self) -> dict[str, float]:
        """Failed pods by reason code, mean per seed."""
        total: Counter[str] = Counter()
        for s in self.seeds:
            total.update(s.failures)
        return {k: v / len(self.seeds) for k, v in sorted(total.items())}

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.seeds)

    def as_dict(self) -> dict[str, object]:
        key = f"alloc_ratio_{round(self.tune * 100)}"
        return {
            "policy": self.policy,
            "tune": self.tune,
            "seeds": [s.seed for s in self.seeds],
            "alloc_ratio_100": round(self.alloc_ratio_100, 3),
            key: round(self.alloc_ratio_final, 3),
            "failures_by_cause": {k: round(v, 1) for k, v in self.failures.items()},
            "pods_per_seed": float(np.mean([s.pods for s in self.seeds])),
            "run_time_s": round(self.seconds, 2),
            "per_seed": [
                {
                    "seed": s.seed,
                    "alloc_ratio_100": round(s.alloc_ratio_100, 3),
                    key: round(s.alloc_ratio_final, 3),
                    "failed": sum(s.failures.values()),
                    "seconds": round(s.seconds, 2),
                }
                for s in self.seeds
            ],
        }


def run_seed(
    nodes: Sequence[NodeInfo],
    pods: Sequence[Request],
    policy_name: str,
    seed: int,
    tune: float = 1.3,
    clock: Callable[[], float] = time.perf_counter,
) -> SeedResult:
    """One replay: tune the arrivals with `seed`, place every pod in order, measure."""
    snap = Snapshot(nodes)
    capacity = int(snap.dev_milli_cap.sum())
    rng = np.random.default_rng(seed)
    arrivals = tuned_pods(pods, capacity, tune, rng)
    policy: Policy = policy_class(policy_name).for_mix(pods)
    ties = np.random.default_rng([seed, 1])
    start = clock()
    arrived = allocated = 0
    at_100: float | None = None
    failures: Counter[str] = Counter()
    # No departures: free resources only shrink, so a shape that failed once fails again and
    # is not scheduled again; its reason is worked out on the current state (`explain`).
    failed: set[tuple[object, ...]] = set()
    for pod in arrivals:
        if pod.shape in failed:
            reason = Decision(pod.job_id, None, explain(snap, pod)).primary_reason
            failures[reason.code.value if reason else "Unknown"] += 1
        elif (decision := schedule(snap, pod, policy, ties)).placement is not None:
            snap.commit(decision.placement)
            allocated += pod.gpu_demand_milli
        else:
            failed.add(pod.shape)
            reason = decision.primary_reason
            failures[reason.code.value if reason else "Unknown"] += 1
        arrived += pod.gpu_demand_milli
        if at_100 is None and arrived >= capacity:
            at_100 = 100.0 * allocated / capacity
    final = 100.0 * allocated / capacity
    return SeedResult(
        seed,
        len(arrivals),
        len(arrivals) - sum(failures.values()),
        final if at_100 is None else at_100,
        final,
        dict(failures),
        clock() - start,
    )


def simulate(
    nodes: Sequence[NodeInfo],
    pods: Sequence[Request],
    policy_name: str,
    seeds: Sequence[int],
    tune: float = 1.3,
    progress: Callable[[SeedResult], None] | None = None,
) -> SimulationResult:
    """Replay every seed with one policy; `progress` is called after each seed."""
    policy_class(policy_name)  # unknown names fail before any work
    result = SimulationResult(policy_name, tune)
    for seed in seeds:
        r = run_seed(nodes, pods, policy_name, seed, tune)
        result.seeds.append(r)
        if progress is not None:
            progress(r)
    return result


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,45' or '42' to a list of seeds."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise ConfigError(f"seeds must look like 42-51 or 42,43: got {text!r}") from None
    if not out:
        raise ConfigError("no seeds given")
    return out
