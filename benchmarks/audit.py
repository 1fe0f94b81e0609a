"""The GPU audit on the seed-like fleet: findings against ground truth, cards freed, replay, scale.

Accuracy (`benchmarks/results/audit.json`), per fleet seed, then the median and spread
(min..max) over the seeds:
- precision and recall of each finding class against the fleet's labelled ground truth
  (`audit/fleet.py`: labels come from each workload's latent profile, not from the samples);
- cards the re-pack plan frees (share of the cards held), its moves, and placement violations
  (the final placements committed again on a fresh snapshot of the estate);
- recommendations some recorded sample exceeds in memory on replay (must be 0).

Scale (`benchmarks/results/audit_scale.json`): a `--scale-cards` fleet (10,000 by default) over
`--scale-days` days (7) at 1-minute samples is generated once, streamed into a sample store and
a traffic store (not timed); then the whole audit (statistics, recommendations, findings, the
plan) is timed on the stores, and the replay and usage after it, each on their own.

    .venv/bin/python benchmarks/audit.py                          # seeds 0-4, then 10,000 GPUs
    .venv/bin/python benchmarks/audit.py --seeds 0-1 --scale-cards 1000 --scale-days 1
    .venv/bin/python benchmarks/audit.py --skip-scale
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _extras import optional_imports

with optional_imports():
    import pyarrow as pa

    from _results import save
    from gpuplane.audit.findings import FindingKind
    from gpuplane.audit.fleet import FleetSpec, generate
    from gpuplane.audit.pipeline import run_audit
    from gpuplane.audit.plan import make_plan
    from gpuplane.audit.recommend import replay
    from gpuplane.audit.sample_store import SampleStore
    from gpuplane.audit.samples import SAMPLE_SCHEMA, TRAFFIC_SCHEMA
    from gpuplane.audit.usage import usage

RESULTS = Path(__file__).with_name("results")


def parse_seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def accuracy(seed: int) -> dict[str, Any]:
    fleet = generate(seed)
    samples, traffic = fleet.samples(), fleet.traffic()
    audit = run_audit(samples, traffic)
    truth = fleet.truth(audit.settings)
    classes: dict[str, dict[str, float]] = {}
    for kind in FindingKind:
        real = {n for n, c in truth.items() if kind in c}
        found = {f.subject for f in audit.findings if f.kind is kind}
        hit = len(real & found)
        classes[str(kind)] = {
            "truth": len(real),
            "found": len(found),
            "precision": hit / len(found) if found else 1.0,
            "recall": hit / len(real) if real else 1.0,
        }
    rp = replay(samples, audit.recommendations.values())
    plan = audit.plan
    return {
        "seed": seed,
        "classes": classes,
        "cards": plan.cards,
        "held_before": plan.held_before,
        "held_after": plan.held_after,
        "freed": plan.freed,
        "freed_ratio": plan.freed_ratio,
        "moves": sum(1 for m in plan.moves if m.action == "move"),
        "retired": sum(1 for m in plan.moves if m.action == "retire"),
        "violations": plan.violations,
        "replay_exceeded": rp.exceeded,
        "replay_samples": rp.samples,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def scale(cards: int, days: float, root: Path) -> dict[str, Any]:
    spec = FleetSpec(cards=cards, days=days)
    t0 = time.perf_counter()
    fleet = generate(0, spec)
    store, traffic = SampleStore(root / "samples"), SampleStore(root / "traffic", TRAFFIC_SCHEMA)
    rows = 0
    for batch in fleet.sample_batches(per_batch=1024):
        store.append(pa.Table.from_batches([batch], SAMPLE_SCHEMA))
        rows += batch.num_rows
    traffic_rows = 0
    for batch in fleet.traffic_batches(per_batch=1024):
        traffic.append(pa.Table.from_batches([batch], TRAFFIC_SCHEMA))
        traffic_rows += batch.num_rows
    generated_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    audit = run_audit(store, traffic)
    audit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    make_plan(audit.stats, audit.recommendations, audit.findings, audit.settings)
    plan_s = time.perf_counter() - t0  # the plan alone, again: the rest of audit_s is the scans
    t0 = time.perf_counter()
    rp = replay(store, audit.recommendations.values())
    replay_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    u = usage(store, audit.stats.window, audit.settings)
    usage_s = time.perf_counter() - t0
    disk = sum(p.stat().st_size for p in root.rglob("*.parquet"))
    return {
        "cards": cards,
        "days": days,
        "samples": rows,
        "traffic_rows": traffic_rows,
        "store_bytes": disk,
        "generate_and_store_s": round(generated_s, 1),
        "audit_s": round(audit_s, 1),
        "of_which_plan_s": round(plan_s, 1),
        "replay_s": round(replay_s, 1),
        "usage_s": round(usage_s, 1),
        "workloads": len(audit.stats.workloads),
        "findings": len(audit.findings),
        "freed_ratio": round(audit.plan.freed_ratio, 4),
        "violations": audit.plan.violations,
        "replay_exceeded": rp.exceeded,
        "usage_reconciled": u.reconciled,
        "usage_gap": u.gap,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-4", help="fleet seeds, e.g. 0-4 (accuracy)")
    ap.add_argument("--scale-cards", type=int, default=10_000)
    ap.add_argument("--scale-days", type=float, default=7.0)
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--json", action="store_true", help="also print the results as one line")
    args = ap.parse_args()
    if not args.skip_accuracy:
        runs = []
        for seed in parse_seeds(args.seeds):
            r = accuracy(seed)
            runs.append(r)
            worst = min(r["classes"].items(), key=lambda kv: kv[1]["precision"] + kv[1]["recall"])
            print(
                f"seed {seed}: frees {r['freed']}/{r['held_before']} cards "
                f"({r['freed_ratio']:.1%}), {r['moves']} moves, {r['violations']} violations, "
                f"{r['replay_exceeded']} exceeded on replay; weakest class {worst[0]} "
                f"P={worst[1]['precision']:.3f} R={worst[1]['recall']:.3f}"
            )
        summary = {
            str(k): {
                m: spread([r["classes"][str(k)][m] for r in runs]) for m in ("precision", "recall")
            }
            for k in FindingKind
        }
        out = {
            "seeds": [r["seed"] for r in runs],
            "classes": summary,
            "freed_ratio": spread([r["freed_ratio"] for r in runs]),
            "moves": spread([r["moves"] for r in runs]),
            "violations": sum(r["violations"] for r in runs),
            "replay_exceeded": sum(r["replay_exceeded"] for r in runs),
            "runs": runs,
        }
        for k, v in summary.items():
            p, r = v["precision"], v["recall"]
            print(
                f"  {k:18s} precision {p['median']:.3f} [{p['min']:.3f}..{p['max']:.3f}]  "
                f"recall {r['median']:.3f} [{r['min']:.3f}..{r['max']:.3f}]"
            )
        save(out, RESULTS / "audit.json", echo_json=args.json)
    if not args.skip_scale:
        with tempfile.TemporaryDirectory(prefix="gpuplane-audit-") as tmp:
            r = scale(args.scale_cards, args.scale_days, Path(tmp))
        print(
            f"{r['cards']} GPUs x {r['days']:g} days: {r['samples']:,} samples "
            f"({r['store_bytes'] / r['samples']:.2f} B each) audited in {r['audit_s']} s "
            f"(the plan {r['of_which_plan_s']} s of it) "
            f"(replay {r['replay_s']} s, usage {r['usage_s']} s); frees {r['freed_ratio']:.1%}, "
            f"{r['violations']} violations, {r['replay_exceeded']} exceeded"
        )
        save(r, RESULTS / "audit_scale.json", echo_json=args.json)


if __name__ == "__main__":
    main()
