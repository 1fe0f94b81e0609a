"""Per-workload usage statistics from the sample store, in streaming Arrow scans.

Everything downstream (findings, recommendations, the plan, usage) reads these few hundred bytes
per workload, never the samples. The scans run in Arrow's streaming engine (Acero: scan → filter
→ hash aggregate), so a 10,000-GPU week is read once per pass without being held in memory;
quantiles are t-digests (exact at the tails to well under a slice step), maxima are exact.

A workload is judged on all its samples in the window, against the largest allocation it held
there; one that was re-placed mid-window (`moved`) is sized on its peak over both placements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc
import pyarrow.dataset as ds

from gpuplane.audit.sample_store import SampleStore

Source: TypeAlias = "ds.Dataset | pa.Table | SampleStore"
_KEYS = (
    "workload", "team", "kind", "cluster", "node", "card", "gpu_model",
    "card_mem_mib", "alloc_mem_mib", "alloc_cores_pct",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorkloadStat:
    """One workload's allocation and what it used of it over the window."""

    workload: str
    team: str
    kind: str
    cluster: str
    node: str
    card: str
    gpu_model: str
    card_mem_mib: int
    alloc_mem_mib: int
    alloc_cores_pct: int
    samples: int
    first_s: int
    last_s: int
    mem_p50: float
    mem_p99: float
    mem_max: float
    compute_p95: float
    compute_max: float
    recent_compute_max: float | None  # max compute over the idle window at the end; None: none
    requests: int | None = None  # requests in the window (inference with traffic data), else None
    deployment: str = ""  # the gateway's deployment of an inference instance ("" when unknown)
    moved: bool = False  # held more than one card in the window; sized over both

    @property
    def alloc_share(self) -> float:
        """Share of its card it holds: max of memory and compute shares (the gpu_milli rule)."""
        return min(1.0, max(self.alloc_mem_mib / self.card_mem_mib, self.alloc_cores_pct / 100))


@dataclass(frozen=True, slots=True)
class SampleWindow:
    """The span the samples cover and their step, in unix seconds."""

    start_s: int
    end_s: int  # the last sample's time plus one step
    step_s: int


@dataclass(frozen=True, slots=True)
class Timeline:
    """The fleet over time: per sample time, GPUs allocated and used (compute), in cards."""

    times: np.ndarray
    allocated: np.ndarray
    used: np.ndarray
    mem_allocated_gib: np.ndarray
    mem_used_gib: np.ndarray


@dataclass(frozen=True, slots=True)
class SampledCard:
    """One card the samples name (held or free)."""

    cluster: str
    node: str
    card: str
    gpu_model: str
    card_mem_mib: int


@dataclass(frozen=True, slots=True)
class FleetStats:
    """What one pass over the store gives the audit."""

    window: SampleWindow
    timeline: Timeline
    workloads: list[WorkloadStat]
    cards: list[SampledCard]


def fleet_stats(source: Source, idle_for_s: int, traffic: Source | None = None) -> FleetStats:
    """The window, the timeline, every workload's statistics and the cards, from the store (and
    the gateway's traffic, for inference workloads)."""
    window, line = timeline(source)
    workloads, cards = workload_stats(source, window, idle_for_s, traffic)
    return FleetStats(window, line, workloads, cards)


def dataset(source: Source) -> ds.Dataset:
    """A table, a dataset or a sample store (all its live parts) as one dataset to scan."""
    if isinstance(source, pa.Table):
        return ds.dataset(source)
    if isinstance(source, SampleStore):
        files = [str(p) for d in source.days() for p in source.parts(d)]
        if not files:
            raise ValueError(
                f"the sample store {source.root} holds no samples: collect some first "
                "(gpuplane audit collect)"
            )
        return ds.dataset(files, schema=source.schema, format="parquet")
    return source


def run(source: Source, columns: list[str], *steps: ac.Declaration) -> pa.Table:
    scan = ac.Declaration("scan", ac.ScanNodeOptions(dataset(source), columns=columns))
    return ac.Declaration.from_sequence([scan, *steps]).to_table(use_threads=True)


def _filter(expr: pc.Expression) -> ac.Declaration:
    return ac.Declaration("filter", ac.FilterNodeOptions(expr))


def aggregate(aggs: list[tuple[object, ...]], keys: list[str]) -> ac.Declaration:
    return ac.Declaration("aggregate", ac.AggregateNodeOptions(aggs, keys=keys))


def plain(columns: list[str]) -> ac.Declaration:
    """Dictionary strings as plain strings: each Parquet row group has its own dictionary, and
    the hash aggregate groups by value, not by dictionary code."""
    exprs = [pc.field(c).cast(pa.string()) if c in _STRINGS else pc.field(c) for c in columns]
    return ac.Declaration("project", ac.ProjectNodeOptions(exprs, columns))


_STRINGS = frozenset({"workload", "team", "kind", "cluster", "node", "card", "gpu_model",
                      "instance", "deployment"})  # fmt: skip


def share() -> pc.Expression:
    """A row's share of its card (max of memory and compute shares); null where the row does not
    say its allocation (a usage-only collector: another row says it)."""
    mem = pc.divide(pc.field("alloc_mem_mib").cast(pa.float64()), pc.field("card_mem_mib"))
    cores = pc.divide(pc.field("alloc_cores_pct").cast(pa.float64()), 100.0)
    out = pc.min_element_wise(pc.max_element_wise(mem, cores, skip_nulls=False), 1.0)
    return pc.if_else(pc.field("workload") == "", 0.0, out)


def timeline(source: Source) -> tuple[SampleWindow, Timeline]:
    """The window and the fleet's allocated and used GPUs at every sample time."""
    project = ac.Declaration(
        "project",
        ac.ProjectNodeOptions(
            [
                pc.field("time"),
                share(),
                pc.field("compute_share"),
                pc.field("alloc_mem_mib").cast(pa.float64()),
                pc.field("mem_used_mib"),
            ],
            ["time", "share", "compute", "alloc_mem", "mem_used"],
        ),
    )
    agg = aggregate(
        [
            ("share", "hash_sum", None, "allocated"),
            ("compute", "hash_sum", None, "used"),
            ("alloc_mem", "hash_sum", None, "alloc_mem"),
            ("mem_used", "hash_sum", None, "mem_used"),
        ],
        ["time"],
    )
    cols = ["time", "workload", "alloc_mem_mib", "card_mem_mib", "alloc_cores_pct",
            "compute_share", "mem_used_mib"]  # fmt: skip
    t = run(source, cols, project, agg).sort_by("time")
    if t.num_rows == 0:
        raise ValueError("the sample store holds no samples")
    times = t["time"].cast(pa.int64()).to_numpy()
    step = int(np.median(np.diff(times))) if len(times) > 1 else 60
    window = SampleWindow(int(times[0]), int(times[-1]) + step, step)
    return window, Timeline(
        times,
        t["allocated"].to_numpy(),
        t["used"].to_numpy(),
        t["alloc_mem"].to_numpy() / 1024,
        t["mem_used"].to_numpy() / 1024,
    )


def workload_stats(
    source: Source, window: SampleWindow, idle_for_s: int, traffic: Source | None = None
) -> tuple[list[WorkloadStat], list[SampledCard]]:
    """Each allocated workload's statistics over `window`, and every card the samples name."""
    allocated = pc.field("workload") != ""
    attrs = ("team", "kind", "cluster", "node", "card", "gpu_model")
    agg = aggregate(
        [
            ("mem_used_mib", "hash_tdigest", pc.TDigestOptions(q=[0.5, 0.99]), "mem_q"),
            ("mem_used_mib", "hash_max", None, "mem_max"),
            ("compute_share", "hash_tdigest", pc.TDigestOptions(q=[0.95]), "compute_q"),
            ("compute_share", "hash_max", None, "compute_max"),
            ("time", "hash_min", None, "first"),
            ("time", "hash_max", None, "last"),
            ("time", "hash_count", None, "samples"),
            ("card_mem_mib", "hash_max", None, "card_mem_mib"),
            ("alloc_mem_mib", "hash_max", None, "alloc_mem_mib"),
            ("alloc_cores_pct", "hash_max", None, "alloc_cores_pct"),
            *((a, "hash_min_max", None, a) for a in attrs),
        ],
        ["workload"],
    )
    cols = [*_KEYS, "time", "mem_used_mib", "compute_share"]
    t = run(source, cols, _filter(allocated), plain(cols), agg)
    since = pa.scalar(window.end_s - idle_for_s, pa.timestamp("s", tz="UTC"))
    recent = run(
        source,
        ["workload", "time", "compute_share"],
        _filter(allocated & (pc.field("time") >= since)),
        plain(["workload", "compute_share"]),
        aggregate([("compute_share", "hash_max", None, "recent")], ["workload"]),
    )
    recent_of = dict(zip(recent["workload"].to_pylist(), recent["recent"].to_pylist(), strict=True))
    traffic_of = _requests(traffic) if traffic is not None else {}
    out = []
    for r in t.to_pylist():
        w = str(r["workload"])
        if r["mem_max"] is None or r["compute_max"] is None:
            continue  # no usage samples (allocations only): nothing to size it on
        kind = str(r["kind"]["max"])
        measured = kind == "inference" and traffic is not None
        out.append(
            WorkloadStat(
                workload=w,
                team=str(r["team"]["max"]),
                kind=kind,
                cluster=str(r["cluster"]["max"]),
                node=str(r["node"]["max"]),
                card=str(r["card"]["max"]),
                gpu_model=str(r["gpu_model"]["max"]),
                card_mem_mib=int(r["card_mem_mib"]),
                # unknown allocation: the whole card (HAMi's default, no limit)
                alloc_mem_mib=_or(r["alloc_mem_mib"], int(r["card_mem_mib"])),
                alloc_cores_pct=_or(r["alloc_cores_pct"], 100),
                samples=int(r["samples"]),
                first_s=_ts(r["first"]),
                last_s=_ts(r["last"]),
                mem_p50=float(r["mem_q"][0]),
                mem_p99=float(r["mem_q"][1]),
                mem_max=float(r["mem_max"]),
                compute_p95=float(r["compute_q"][0]),
                compute_max=float(r["compute_max"]),
                recent_compute_max=recent_of.get(w),
                requests=traffic_of.get(w, ("", 0))[1] if measured else None,
                deployment=traffic_of.get(w, ("", 0))[0],
                moved=r["node"]["min"] != r["node"]["max"] or r["card"]["min"] != r["card"]["max"],
            )
        )
    out.sort(key=lambda x: x.workload)
    return out, cards(source)


def cards(source: Source) -> list[SampledCard]:
    """Every card the samples name, held or free."""
    keys = ["cluster", "node", "card", "gpu_model"]
    t = run(
        source,
        [*keys, "card_mem_mib"],
        plain([*keys, "card_mem_mib"]),
        aggregate([("card_mem_mib", "hash_max", None, "card_mem_mib")], keys),
    )
    out = [SampledCard(**r) for r in t.to_pylist()]
    return sorted(out, key=lambda c: (c.cluster, c.node, c.card))


def _requests(traffic: Source) -> dict[str, tuple[str, int]]:
    """(deployment, requests in the window) per inference workload. The gateway names an
    instance by its URL; the workload is the URL's host (the pod's or process's name), or the
    instance itself when it is not a URL. The deployment is the model it serves."""
    cols = ["instance", "model", "requests"]
    t = run(
        traffic,
        cols,
        plain(cols),
        aggregate([("requests", "hash_sum", None, "requests")], ["instance", "model"]),
    )
    out: dict[str, tuple[str, int]] = {}
    rows = zip(t["instance"].to_pylist(), t["model"].to_pylist(), t["requests"].to_pylist(),
               strict=True)  # fmt: skip
    for instance, model, n in rows:
        name = urlsplit(instance).hostname or instance if "://" in instance else instance
        dep, seen = out.get(name, (str(model), 0))
        out[name] = (dep, seen + int(n))
    return out


def _or(value: Any, default: int) -> int:
    return default if value is None else int(value)


def _ts(value: object) -> int:
    """A timestamp from Arrow's Python conversion as unix seconds."""
    return int(value.timestamp())  # type: ignore[attr-defined]
