"""The audit's sample store at scale: bytes per sample, scan time for a day of 10,000 GPUs.

Fleet: `--cards` cards (8 per node, 4 clusters, 20 teams, one workload per two cards), one
sample per card per minute for `--hours` hours (default 24: 14.4 M samples), usage as NVML
reports it (whole MiB, whole percent of the card's SMs) drawn per card around a seeded level.
The day is appended hourly, as a collector writes it, then compacted into one file.

Reported per seed, then the median and spread (min..max) over seeds:
- bytes per sample on disk, after compaction (and before, as hourly parts);
- seconds to scan the whole day with every column into one Arrow table;
- seconds to scan the day's `card, time, mem_used_mib, compute_share` (what findings read);
- seconds to scan one team's samples (a filter pushed into the scan).

    .venv/bin/python benchmarks/audit_store.py                     # 10,000 cards, 24 h, seeds 0-2
    .venv/bin/python benchmarks/audit_store.py --cards 1000 --hours 2 --seeds 0
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _extras import optional_imports

with optional_imports():
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from _results import save
    from gpuplane.audit.sample_store import SampleStore
    from gpuplane.audit.samples import coerce

RESULTS = Path(__file__).with_name("results") / "audit_store.json"
START = datetime(2026, 12, 1, tzinfo=UTC)


def fleet(cards: int, minutes: int, start: datetime, seed: int = 0) -> pa.Table:
    """`cards` cards sampled once a minute for `minutes` from `start`, as one sample table."""
    rng = np.random.default_rng(seed)
    n = cards * minutes
    card = pa.array(np.tile(np.arange(cards), minutes))
    names = [f"GPU-{i:08x}-0000-0000-0000-{i:012x}" for i in range(cards)]
    mem_base = rng.uniform(500, 20_000, cards)
    share_base = rng.uniform(0, 0.6, cards)
    idx = np.tile(np.arange(cards), minutes)
    times = pa.array(
        [start + timedelta(minutes=m) for m in range(minutes)], pa.timestamp("s", "UTC")
    )
    table = pa.table(
        {
            "time": times.take(pa.array(np.repeat(np.arange(minutes), cards))),
            "cluster": pa.array([f"c{i % 4}" for i in range(cards)]).take(card),
            "node": pa.array([f"node-{i // 8}" for i in range(cards)]).take(card),
            "card": pa.array(names).take(card),
            "gpu_model": pa.array(["A100-80GB"] * cards).take(card),
            "workload": pa.array([f"svc-{i // 2}" for i in range(cards)]).take(card),
            "team": pa.array([f"team-{i % 20}" for i in range(cards)]).take(card),
            "kind": pa.array([("inference", "batch")[i % 2] for i in range(cards)]).take(card),
            "card_mem_mib": pa.array(np.full(n, 81920, np.int32)),
            "alloc_mem_mib": pa.array(np.full(n, 81920, np.int32)),
            "alloc_cores_pct": pa.array(np.full(n, 100, np.int16)),
            # as NVML reports them: whole MiB, whole percent of the card's SMs
            "mem_used_mib": pa.array(
                np.round(mem_base[idx] * rng.uniform(0.95, 1.05, n)).astype(np.float32)
            ),
            "compute_share": pa.array(
                (
                    np.round(np.clip(share_base[idx] + rng.normal(0, 0.05, n), 0, 1) * 100) / 100
                ).astype(np.float32)
            ),
        }
    )
    return coerce(table)


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def one_seed(cards: int, hours: int, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        store = SampleStore(root)
        for hour in range(hours):
            store.append(fleet(cards, 60, START + timedelta(hours=hour), seed * 1000 + hour))
        [day] = store.days()
        rows = cards * 60 * hours
        parts_bytes = sum(p.stat().st_size for p in store.parts(day))
        compact_s, _ = _timed(lambda: store.compact(day))
        compact_bytes = sum(p.stat().st_size for p in store.parts(day))
        full_s, full = _timed(store.scan)
        assert full.num_rows == rows
        cols_s, _ = _timed(
            lambda: store.scan(columns=["card", "time", "mem_used_mib", "compute_share"])
        )
        team_s, team = _timed(lambda: store.scan(filter=pc.field("team") == "team-3"))
        assert team.num_rows == rows // 20
        return {
            "samples": rows,
            "bytes_per_sample_parts": parts_bytes / rows,
            "bytes_per_sample": compact_bytes / rows,
            "compact_s": compact_s,
            "scan_all_s": full_s,
            "scan_findings_columns_s": cols_s,
            "scan_one_team_s": team_s,
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, default=10_000)
    parser.add_argument("--hours", type=int, default=24, choices=range(1, 25))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)
    runs = []
    for seed in args.seeds:
        runs.append(one_seed(args.cards, args.hours, seed))
        print(f"seed {seed}: " + ", ".join(f"{k} {v:.3g}" for k, v in runs[-1].items()))
    summary = {
        key: {
            "median": statistics.median(r[key] for r in runs),
            "min": min(r[key] for r in runs),
            "max": max(r[key] for r in runs),
        }
        for key in runs[0]
        if key != "samples"
    }
    for key, s in summary.items():
        print(f"{key:28s} {s['median']:.3f}  ({s['min']:.3f}..{s['max']:.3f})")
    out = {"cards": args.cards, "hours": args.hours, "seeds": args.seeds, "summary": summary}
    out["runs"] = runs
    out["projected_week_bytes"] = summary["bytes_per_sample"]["median"] * args.cards * 7 * 1440
    save(out, RESULTS, echo_json=args.json)


if __name__ == "__main__":
    main()
