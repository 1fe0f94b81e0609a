"""Small sample tables for the audit's tests: one workload's series on one card, built with the
real schema (`samples.coerce`), so every test goes through what collectors write."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from gpuplane.audit.samples import SAMPLE_SCHEMA, TRAFFIC_SCHEMA, coerce

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
