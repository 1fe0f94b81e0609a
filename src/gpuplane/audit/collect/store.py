"""Allocations over time from the control plane's store: which job held which card, when.

The pure part (`allocation_samples`) turns cards and holdings into one sample per card per
step: one per job holding it (its slice as the allocation columns), or one with
`workload = ""` when nothing held it. Usage is not in the store, so `mem_used_mib` and
`compute_share` are null: NVML or Prometheus samples fill them. The edge (`read_holdings`)
reads the existing models with plain SELECTs (SQLite or PostgreSQL), never writing.

A job's slice comes from its spec, as HAMi applies it: a fractional slice's `gpu_mem_mib` and
`gpu_cores_pct` (an unset one is the whole card, HAMi's default of no limit), whole cards as
100 % each. A job keeps the devices of its last placement only; an earlier attempt's cards are
not in the store, and the samples attribute the whole run to its last placement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
from sqlalchemy import or_, select
from sqlalchemy.exc import SQLAlchemyError

from gpuplane.audit.collect import CollectError
from gpuplane.audit.samples import SAMPLE_SCHEMA, coerce, validate
from gpuplane.audit.stats import SampleWindow
from gpuplane.control.store.models import Device, Job, Node
from gpuplane.control.store.store import Store


@dataclass(frozen=True, slots=True)
class Card:
    """One device as the store declares it."""

    cluster: str
    node: str
    index: int
    model: str
    mem_mib: int
    uuid: str | None = None

    @property
    def name(self) -> str:
        return self.uuid or f"{self.node}/{self.index}"


@dataclass(frozen=True, slots=True)
class Holding:
    """One job's slice of one card from `start` until `end` (None: still holding it)."""

    workload: str
    team: str
    cluster: str
    node: str
    index: int
    start: float
    end: float | None
    mem_mib: int | None  # None: the whole card's memory
    cores_pct: int


def allocation_samples(
    cards: Sequence[Card], holdings: Sequence[Holding], since: float, until: float, step_s: float
) -> pa.Table:
    """One sample per card per step in `[since, until)` (times on multiples of `step_s`, epoch
    seconds): a row per job holding the card then, or one with no workload."""
    times = _times(since, until, step_s)
    by_card: dict[tuple[str, str, int], list[Holding]] = {}
    for h in holdings:
        by_card.setdefault((h.cluster, h.node, h.index), []).append(h)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("time", "card", "held", "mem", "cores")}
    text: dict[str, list[str]] = {"workload": [], "team": []}
    for ci, card in enumerate(cards):
        free = np.ones(len(times), dtype=bool)
        for h in by_card.get((card.cluster, card.node, card.index), []):
            mask = (times >= h.start) & (times < (until if h.end is None else h.end))
            n = int(mask.sum())
            if not n:
                continue
            free &= ~mask
            cols["time"].append(times[mask])
            cols["card"].append(np.full(n, ci))
            cols["held"].append(np.ones(n, dtype=bool))
            cols["mem"].append(np.full(n, min(h.mem_mib or card.mem_mib, card.mem_mib)))
            cols["cores"].append(np.full(n, h.cores_pct))
            text["workload"] += [h.workload] * n
            text["team"] += [h.team] * n
        n = int(free.sum())
        cols["time"].append(times[free])
        cols["card"].append(np.full(n, ci))
        cols["held"].append(np.zeros(n, dtype=bool))
        cols["mem"].append(np.zeros(n))
        cols["cores"].append(np.zeros(n))
        text["workload"] += [""] * n
        text["team"] += [""] * n
    flat = {k: np.concatenate(v) if v else np.array([]) for k, v in cols.items()}
    idx = pa.array(flat["card"].astype(np.int64))
    held = flat["held"]
    table = pa.table(
        {
            "time": pa.array(flat["time"].astype("datetime64[s]")),
            "cluster": pa.array([c.cluster for c in cards], pa.string()).take(idx),
            "node": pa.array([c.node for c in cards], pa.string()).take(idx),
            "card": pa.array([c.name for c in cards], pa.string()).take(idx),
            "gpu_model": pa.array([c.model for c in cards], pa.string()).take(idx),
            "workload": pa.array(text["workload"], pa.string()),
            "team": pa.array(text["team"], pa.string()),
            "kind": pa.array(np.where(held, "batch", "")),  # a job runs to completion
            "card_mem_mib": pa.array([c.mem_mib for c in cards], pa.int32()).take(idx),
            "alloc_mem_mib": pa.array(flat["mem"].astype(np.int32)),
            "alloc_cores_pct": pa.array(flat["cores"].astype(np.int16)),
            "mem_used_mib": pa.nulls(len(held), pa.float32()),
            "compute_share": pa.nulls(len(held), pa.float32()),
        }
    )
    table = coerce(table, SAMPLE_SCHEMA)
    validate(table)
    return table


def _times(since: float, until: float, step_s: float) -> np.ndarray:
    return np.arange(math.ceil(since / step_s) * step_s, until, step_s, dtype=np.float64)


def window_of(since: float, until: float, step_s: float) -> SampleWindow:
    """The window `allocation_samples` covers for the same arguments: its first sample time to
    its last plus one step, so physical GPU-hours count exactly the steps it samples."""
    times = _times(since, until, step_s)
    start = int(times[0]) if len(times) else int(since)
    return SampleWindow(start, start + len(times) * int(step_s), int(step_s))


def read_holdings(store: Store, since: float, until: float) -> tuple[list[Card], list[Holding]]:
    """Every declared card, and every job that held cards at some time in `[since, until)`."""
    with store.session() as session:
        rows = session.execute(
            select(
                Node.cluster_name,
                Node.name,
                Device.index,
                Device.model,
                Device.mem_mib,
                Device.uuid,
            )
            .join(Device, Device.node_id == Node.id)
            .order_by(Node.cluster_name, Node.name, Device.index)
        ).all()
        cards = [Card(*row) for row in rows]
        jobs = session.execute(
            select(Job, Node.cluster_name, Node.name)
            .join(Node, Job.node_id == Node.id)
            .where(
                Job.started_at.is_not(None),
                Job.started_at < until,
                or_(Job.finished_at.is_(None), Job.finished_at > since),
            )
        ).all()
    holdings = []
    for job, cluster, node in jobs:
        if job.started_at is None:  # excluded by the query; narrows the type
            continue
        indices = list(job.devices or [])
        resources = (job.spec or {}).get("resources", {})
        fractional = resources.get("gpu_mem_mib") is not None or (
            resources.get("gpu_cores_pct") is not None
        )
        for index in indices:
            holdings.append(
                Holding(
                    workload=job.id,
                    team=job.team_name,
                    cluster=cluster,
                    node=node,
                    index=int(index),
                    start=job.started_at,
                    end=job.finished_at,
                    mem_mib=resources.get("gpu_mem_mib") if fractional else None,
                    cores_pct=int(resources.get("gpu_cores_pct") or 100) if fractional else 100,
                )
            )
    return cards, holdings


def collect(url: str, since: datetime, until: datetime, step_s: float = 60.0) -> pa.Table:
    """The allocation samples of the store at `url` for `[since, until)`."""
    store = Store(url)
    try:
        cards, holdings = read_holdings(store, since.timestamp(), until.timestamp())
    except SQLAlchemyError as exc:
        raise CollectError(
            f"cannot read the control plane's store at {store.safe_url}: "
            f"{getattr(exc, 'orig', None) or exc}; is it the database_url of `control:` "
            "(migrated by `gpuplane control serve`)?"
        ) from None
    finally:
        store.close()
    return allocation_samples(cards, holdings, since.timestamp(), until.timestamp(), step_s)


__all__ = ["Card", "Holding", "allocation_samples", "collect", "read_holdings", "window_of"]
