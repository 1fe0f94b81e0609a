"""The console overview's history: GPUs allocated and used per cluster and GPU model over time.

Nothing is invented: allocated comes from the store's job spans (each job's slice of its cards
from its start to its end, a slice counting as its share of the card, as `gpuplane usage` counts
it), averaged exactly over each bucket; used comes from the audit samples of
`control.samples_dir` where they exist (per bucket, the mean over its sample times of the compute
the cards' workloads used), and is unknown (None) elsewhere: the store keeps no utilisation.
`allocated` and `series` are pure; `used` scans a sample store; `read` is the edge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuplane.audit.usage_report import Holdings

if TYPE_CHECKING:  # the audit's modules import pyarrow: only when a history is read
    from gpuplane.audit.collect.store import Card, Holding

Key = tuple[str, str]  # (cluster, GPU model)


@dataclass(frozen=True, slots=True)
class Series:
    """One cluster's cards of one GPU model: per bucket, the mean GPUs allocated and used."""

    cluster: str
    gpu_model: str
    cards: int
    allocated: list[float]
    used: list[float | None]  # None: no sample measured that bucket

    @property
    def peak(self) -> float:
        return max(self.allocated, default=0.0)

    @property
    def mean(self) -> float:
        return sum(self.allocated) / len(self.allocated) if self.allocated else 0.0

    @property
    def used_mean(self) -> float | None:
        known = [u for u in self.used if u is not None]
        return sum(known) / len(known) if known else None


@dataclass(frozen=True, slots=True)
class History:
    starts: list[float]  # each bucket's start (unix seconds); all buckets are `width_s` long
    width_s: float
    series: list[Series]
    used_note: str | None  # why `used` is unknown, when it is


def allocated(
    cards: Sequence[Card], holdings: Sequence[Holding], starts: Sequence[float], width_s: float
) -> dict[Key, list[float]]:
    """Mean GPUs held per (cluster, model) in each bucket [start, start + width_s): each
    holding's share of its card times the part of the bucket it overlaps. `cards` and
    `holdings` are `audit.collect.store`'s Card and Holding (a holding with `end` None is
    still held)."""
    card_of = {(c.cluster, c.node, c.index): c for c in cards}
    out: dict[Key, list[float]] = {(c.cluster, c.model): [0.0] * len(starts) for c in cards}
    for h in holdings:
        card = card_of.get((h.cluster, h.node, h.index))
        if card is None:  # a card since removed from the inventory
            continue
        mem = 1.0 if h.mem_mib is None else min(1.0, h.mem_mib / card.mem_mib)
        share = min(1.0, max(mem, h.cores_pct / 100))
        row = out[(card.cluster, card.model)]
        for i, lo in enumerate(starts):
            end = h.end if h.end is not None else lo + width_s
            overlap = min(end, lo + width_s) - max(h.start, lo)
            if overlap > 0:
                row[i] += share * overlap / width_s
    return out


def used(
    samples_dir: Path, starts: Sequence[float], width_s: float
) -> dict[Key, list[float | None]]:
    """Mean GPUs used per (cluster, model) in each bucket, from an audit sample store: the
    compute shares of every row at one sample time summed, then averaged over the bucket's
    sample times. A bucket without samples is None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpuplane.audit.sample_store import SampleStore
    from gpuplane.audit.samples import SAMPLE_SCHEMA
    from gpuplane.audit.stats import dataset

    lo, hi = starts[0], starts[-1] + width_s
    time = SAMPLE_SCHEMA.field("time").type
    t = dataset(SampleStore(samples_dir)).to_table(
        columns=["time", "cluster", "gpu_model", "compute_share"],
        filter=pc.is_valid(pc.field("compute_share"))
        & (pc.field("time") >= pa.scalar(int(lo), pa.int64()).cast(time))
        & (pc.field("time") < pa.scalar(int(hi), pa.int64()).cast(time)),
    )
    t = pa.table(
        {
            "time": t["time"].cast(pa.int64()),  # unix seconds
            "cluster": t["cluster"].cast(pa.string()),
            "gpu_model": t["gpu_model"].cast(pa.string()),
            "compute_share": t["compute_share"].cast(pa.float64()),
        }
    )
    t = t.group_by(["cluster", "gpu_model", "time"]).aggregate([("compute_share", "sum")])
    per_time: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for r in t.to_pylist():
        i = min(int((r["time"] - lo) // width_s), len(starts) - 1)
        per_time[(str(r["cluster"]), str(r["gpu_model"]), i)].append(r["compute_share_sum"])
    out: dict[Key, list[float | None]] = {}
    for (cluster, model, i), values in per_time.items():
        row = out.setdefault((cluster, model), [None] * len(starts))
        row[i] = sum(values) / len(values)
    return out


def read(
    holdings: Holdings, samples_dir: str | None, now: float, span_s: float, buckets: int
) -> History:
    """The last `span_s` before `now` in `buckets` buckets; `holdings` reads the store."""
    width = span_s / buckets
    starts = [now - span_s + i * width for i in range(buckets)]
    cards, spans = holdings(starts[0], now)
    held = allocated(cards, spans, starts, width)
    measured: dict[Key, list[float | None]] = {}
    note = None
    if samples_dir is None:
        note = "not measured: set control.samples_dir to an audit sample store"
    elif not Path(samples_dir).is_dir():
        note = f"not measured: control.samples_dir {samples_dir} is not a directory"
    else:
        try:
            measured = used(Path(samples_dir), starts, width)
        except ValueError as exc:  # a store with no samples yet
            note = f"not measured: {exc}"
    count: dict[Key, int] = defaultdict(int)
    for c in cards:
        count[(c.cluster, c.model)] += 1
    series = [
        Series(cluster, model, count[(cluster, model)], row,
               measured.get((cluster, model), [None] * buckets))
        for (cluster, model), row in sorted(held.items())
    ]  # fmt: skip
    return History(starts, width, series, note)
