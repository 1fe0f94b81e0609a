"""Usage and cost per team in GPU-hours and slice-hours, reconciled to the physical GPU-hours.

A sample's allocation counts its share of the card (`max(memory share, compute share)`, the
gpu_milli rule) for one step: four 25 % slices on one card for an hour are 1.00 GPU-hour, never
four (OpenCost bills HAMi fractions as whole GPUs, opencost issue 3828). Slice-hours are the same
time in grid units (1/`slice_fraction` of a card). Used GPU-hours are the compute the samples
measured; idle GPU-hours are the allocated share of samples with no compute (engine activity
below `idle_compute`), shown apart from use. Free GPU-hours are each card's observed time that no
allocation held.

Reconciliation: allocated + free over every card must equal the physical GPU-hours (cards x
window) within 1 %; a gap means samples are missing (a collector was down) or a card is
over-booked, and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.acero as ac
import pyarrow.compute as pc

from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import Source, Window, aggregate, plain, run, share

TOLERANCE = 0.01


@dataclass(frozen=True, slots=True)
class TeamUsage:
    team: str
    gpu_model: str
    gpu_hours: float
    slice_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    cost: float | None  # None: no price configured for the GPU model


@dataclass(frozen=True, slots=True)
class Usage:
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


def usage(source: Source, window: Window, settings: AuditSettings) -> Usage:
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
            ],
            ["team", "gpu_model", "node", "card", "time", "share", "compute", "idle"],
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
                cost=None if price is None else gpu_h * price,
            )
        )
    free = over = 0.0
    for r in per_card.to_pylist():
        left = r["steps"] - (r["held"] or 0.0)
        free += max(left, 0.0) * hours
        over += max(-left, 0.0) * hours
    physical = per_card.num_rows * (window.end_s - window.start_s) / 3600
    return Usage(tuple(teams), free, physical, over, tuple(sorted(unpriced)))
