"""Small sample tables for the audit's tests: one workload's series on one card, built with the
real schema (`samples.coerce`), so every test goes through what collectors write."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from gpuplane.audit.samples import (
    SAMPLE_SCHEMA,
    TRAFFIC_SCHEMA,
    Sample,
    coerce,
)

CARD = 80 * 1024
T0 = 1_795_000_000 - 1_795_000_000 % 86_400  # a UTC midnight
STEP = 60


def series(
    workload: str,
    mem: Sequence[float] | np.ndarray,
    compute: Sequence[float] | np.ndarray,
    *,
    node: str = "n0",
    card: str = "n0/0",
    team: str = "t",
    kind: str = "inference",
    alloc_mem: int | None = CARD,
    alloc_cores: int | None = 100,
    start: int = T0,
) -> pa.Table:
    """One workload's samples, one a minute from `start`."""
    n = len(mem)
    return coerce(
        pa.table(
            {
                "time": pa.array(start + STEP * np.arange(n), pa.int64()).cast(
                    pa.timestamp("s", tz="UTC")
                ),
                "cluster": ["c"] * n,
                "node": [node] * n,
                "card": [card] * n,
                "gpu_model": ["A100-80GB"] * n,
                "workload": [workload] * n,
                "team": [team if workload else ""] * n,
                "kind": [kind if workload else ""] * n,
                "card_mem_mib": [CARD] * n,
                "alloc_mem_mib": pa.array([alloc_mem] * n, pa.int32()),
                "alloc_cores_pct": pa.array([alloc_cores] * n, pa.int16()),
                "mem_used_mib": pa.array(np.asarray(mem, np.float32)),
                "compute_share": pa.array(np.asarray(compute, np.float32)),
            }
        ),
        SAMPLE_SCHEMA,
    )


def free_card(n: int, node: str = "n0", card: str = "n0/1", start: int = T0) -> pa.Table:
    return series("", [0.0] * n, [0.0] * n, node=node, card=card, alloc_mem=0, alloc_cores=0,
                  start=start)  # fmt: skip


def traffic(instance: str, model: str, requests: Sequence[int], start: int = T0) -> pa.Table:
    n = len(requests)
    return coerce(
        pa.table(
            {
                "time": pa.array(start + STEP * np.arange(n), pa.int64()).cast(
                    pa.timestamp("s", tz="UTC")
                ),
                "model": [model] * n,
                "instance": [instance] * n,
                "requests": list(requests),
                "prompt_tokens": [r * 100 for r in requests],
                "completion_tokens": [r * 10 for r in requests],
                "slot_seconds": [float(r) for r in requests],
            }
        ),
        TRAFFIC_SCHEMA,
    )


def concat(*tables: pa.Table) -> pa.Table:
    return pa.concat_tables(tables).unify_dictionaries()


def _usage_rows(alloc: pa.Table, workload: str, mem_mib: float, compute: float) -> pa.Table:
    """Usage samples for `workload` at the times the store says it held its card."""
    mine = alloc.filter(pa.compute.equal(alloc["workload"].cast(pa.string()), workload))
    n = mine.num_rows
    rows = {name: mine[name] for name in ("time", "cluster", "node", "card", "gpu_model",
                                          "workload", "team", "card_mem_mib")}  # fmt: skip
    rows.update(
        kind=pa.array([""] * n),
        alloc_mem_mib=pa.nulls(n, pa.int32()),
        alloc_cores_pct=pa.nulls(n, pa.int16()),
        mem_used_mib=pa.array(np.full(n, mem_mib, np.float32)),
        compute_share=pa.array(np.full(n, compute, np.float32)),
    )
    return coerce(pa.table(rows), SAMPLE_SCHEMA)


SAMPLE_T0 = datetime(2026, 12, 1, 23, 58, tzinfo=UTC)


def sample(minute: int = 0, **over: Any) -> Sample:
    base: dict[str, Any] = {
        "time": SAMPLE_T0 + timedelta(minutes=minute),
        "cluster": "c1",
        "node": "n1",
        "card": "GPU-aaaa",
        "gpu_model": "A100-80GB",
        "workload": "job-1",
        "team": "vision",
        "kind": "batch",
        "card_mem_mib": 81920,
        "alloc_mem_mib": 10240,
        "alloc_cores_pct": 25,
        "mem_used_mib": 4000.0,
        "compute_share": 0.1,
    }
    return Sample(**(base | over))
