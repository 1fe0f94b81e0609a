"""Usage and cost per team in GPU-hours and slice-hours, reconciled to the physical GPU-hours.

A sample's allocation counts its share of the card (`max(memory share, compute share)`, the
gpu_milli rule) for one step: four 25 % slices on one card for an hour are 1.00 GPU-hour, never
four (OpenCost bills HAMi fractions as whole GPUs, opencost issue 3828). Slice-hours are the same
time in grid units (1/`slice_fraction` of a card). Used GPU-hours are the compute the samples
measured; idle GPU-hours are the allocated share of samples with no compute (engine activity
below `idle_compute`), shown apart from use; both cover only the measured GPU-hours (allocated
share of samples that carry a compute figure), so allocations from the store alone (`gpuplane
usage` without audit samples) report them as unknown, never as zero. Free GPU-hours are each
card's observed time that no allocation held.

Reconciliation: allocated + free over every card must equal the physical GPU-hours (cards x
window) within 1 %; a gap means samples are missing (a collector was down) or a card is
over-booked, and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import SampleWindow, Source, aggregate, dataset, plain, run, share

TOLERANCE = 0.01
_MEASURED = pa.schema([("time", pa.int64()), ("workload", pa.string()), ("compute", pa.float64())])


@dataclass(frozen=True, slots=True)
class TeamUsage:
    team: str
    gpu_model: str
    gpu_hours: float
    slice_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    measured_gpu_hours: float  # of gpu_hours, those whose samples say the compute used
    cost: float | None  # None: no price configured for the GPU model

    def to_json(self) -> dict[str, Any]:
        measured = self.measured_gpu_hours > 0
        return {
            "team": self.team,
            "gpu_model": self.gpu_model,
            "gpu_hours": round(self.gpu_hours, 3),
            "slice_hours": round(self.slice_hours, 3),
            "used_gpu_hours": round(self.used_gpu_hours, 3) if measured else None,
            "idle_gpu_hours": round(self.idle_gpu_hours, 3) if measured else None,
            "measured_gpu_hours": round(self.measured_gpu_hours, 3),
            "cost": None if self.cost is None else round(self.cost, 2),
        }


@dataclass(frozen=True, slots=True)
class UsageReport:
    teams: tuple[TeamUsage, ...]
    free_gpu_hours: float
    physical_gpu_hours: float  # cards x window
    over_booked_gpu_hours: float  # allocated beyond a card's time (must be 0)
    unpriced: tuple[str, ...]  # GPU models without a price

    @property
    def allocated_gpu_hours(self) -> float:
        return sum(t.gpu_hours for t in self.teams)

    @property
    def gap(self) -> float:
        """Relative difference between allocated + free and the physical GPU-hours."""
        if not self.physical_gpu_hours:
            return 0.0
        accounted = self.allocated_gpu_hours + self.free_gpu_hours
        return abs(accounted - self.physical_gpu_hours) / self.physical_gpu_hours

    @property
    def reconciled(self) -> bool:
        return self.gap <= TOLERANCE

    def to_json(self) -> dict[str, Any]:
        return {
            "teams": [t.to_json() for t in self.teams],
            "free_gpu_hours": round(self.free_gpu_hours, 3),
            "physical_gpu_hours": round(self.physical_gpu_hours, 3),
            "reconciled": self.reconciled,
            "gap": round(self.gap, 6),
            "unpriced": list(self.unpriced),
        }


def usage(source: Source, window: SampleWindow, settings: AuditSettings) -> UsageReport:
    """GPU-hours per team and GPU model, free and physical GPU-hours, cost from `prices`."""
    hours = window.step_s / 3600
    project = ac.Declaration(
        "project",
        ac.ProjectNodeOptions(
            [
                pc.field("team"),
                pc.field("gpu_model"),
                pc.field("node"),
                pc.field("card"),
                pc.field("time"),
                share(),
                pc.field("compute_share"),
                pc.if_else(
                    pc.field("compute_share") < settings.idle_compute, share(), pa.scalar(0.0)
                ),
                pc.if_else(pc.is_valid(pc.field("compute_share")), share(), pa.scalar(0.0)),
            ],
            ["team", "gpu_model", "node", "card", "time", "share", "compute", "idle", "measured"],
        ),
    )
    cols = ["team", "gpu_model", "node", "card", "time", "workload", "alloc_mem_mib",
            "card_mem_mib", "alloc_cores_pct", "compute_share"]  # fmt: skip
    per_team = run(
        source,
        cols,
        plain(cols),
        ac.Declaration("filter", ac.FilterNodeOptions(pc.field("workload") != "")),
        project,
        aggregate(
            [
                ("share", "hash_sum", None, "share"),
                ("compute", "hash_sum", None, "compute"),
                ("idle", "hash_sum", None, "idle"),
                ("measured", "hash_sum", None, "measured"),
            ],
            ["team", "gpu_model"],
        ),
    )
    per_card = run(
        source,
        cols,
        plain(cols),
        project,
        aggregate(
            [("time", "hash_count_distinct", None, "steps"), ("share", "hash_sum", None, "held")],
            ["node", "card"],
        ),
    )
    prices: Mapping[str, float] = settings.prices
    teams = []
    unpriced: set[str] = set()
    for r in sorted(per_team.to_pylist(), key=lambda r: (r["team"], r["gpu_model"])):
        gpu_h = (r["share"] or 0.0) * hours
        price = prices.get(r["gpu_model"])
        if price is None:
            unpriced.add(r["gpu_model"])
        teams.append(
            TeamUsage(
                team=r["team"] or "(unknown)",
                gpu_model=r["gpu_model"],
                gpu_hours=gpu_h,
                slice_hours=gpu_h * settings.slice_fraction,
                used_gpu_hours=(r["compute"] or 0.0) * hours,
                idle_gpu_hours=(r["idle"] or 0.0) * hours,
                measured_gpu_hours=(r["measured"] or 0.0) * hours,
                cost=None if price is None else gpu_h * price,
            )
        )
    free = over = 0.0
    for r in per_card.to_pylist():
        left = r["steps"] - (r["held"] or 0.0)
        free += max(left, 0.0) * hours
        over += max(-left, 0.0) * hours
    physical = per_card.num_rows * (window.end_s - window.start_s) / 3600
    return UsageReport(tuple(teams), free, physical, over, tuple(sorted(unpriced)))


def measured(allocations: pa.Table, samples: Source, step_s: float) -> pa.Table:
    """The allocation samples (`audit.collect.store`, on multiples of `step_s`) with the compute
    that audit samples (NVML, Prometheus) measured for the same workload in the same step: their
    mean over its cards there. Rows with no such sample keep a null compute (unknown)."""
    times = allocations["time"]
    lo, hi = pc.min(times), pc.max(times)
    if not lo.is_valid:
        return allocations
    got = (
        dataset(samples)
        .to_table(
            columns=["time", "workload", "compute_share"],
            filter=(pc.field("workload") != "")
            & pc.is_valid(pc.field("compute_share"))
            & (pc.field("time") >= lo)
            & (pc.field("time") < pc.add(hi, pa.scalar(int(step_s), pa.duration("s")))),
        )
        .rename_columns(["time", "workload", "compute"])
        .cast(_MEASURED)
    )
    step = pa.scalar(int(step_s), pa.int64())
    got = got.set_column(0, "time", pc.multiply(pc.divide(got["time"], step), step))
    mean = got.group_by(["workload", "time"]).aggregate([("compute", "mean")])
    keyed = pa.table(
        {
            "workload": allocations["workload"].cast(pa.string()),
            "key_time": allocations["time"].cast(pa.int64()),
            "row": pa.array(range(allocations.num_rows), pa.int64()),
        }
    ).join(
        mean.rename_columns(["workload", "key_time", "compute_share"]),
        ["workload", "key_time"],
        join_type="left outer",
    )
    keyed = keyed.sort_by("row")  # the join does not keep the order
    column = keyed["compute_share"].cast(allocations.schema.field("compute_share").type)
    i = allocations.schema.get_field_index("compute_share")
    return allocations.set_column(i, allocations.schema.field(i), column)
