"""One audit, end to end: statistics → recommendations → findings → the re-pack plan (→ usage).

The CLI, the report and the benchmark all call `run_audit`, so they show the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplane.audit.findings import Finding, find
from gpuplane.audit.plan import RepackPlan, make_plan
from gpuplane.audit.recommend import Recommendation, recommend
from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import FleetStats, Source, fleet_stats


@dataclass(frozen=True, slots=True)
class Audit:
    settings: AuditSettings
    stats: FleetStats
    recommendations: dict[str, Recommendation]
    findings: list[Finding]
    plan: RepackPlan
    traffic: bool  # whether the gateway's traffic was read (zero_traffic needs it)


def run_audit(
    samples: Source, traffic: Source | None = None, settings: AuditSettings | None = None
) -> Audit:
    """Audit the samples (and the gateway's traffic, when given) under `settings`."""
    cfg = settings or AuditSettings()
    stats = fleet_stats(samples, cfg.idle_for_s, traffic)
    recs = {s.workload: recommend(s, cfg) for s in stats.workloads}
    findings = find(stats, recs, cfg, traffic is not None)
    return Audit(
        cfg, stats, recs, findings, make_plan(stats, recs, findings, cfg), traffic is not None
    )
