"""Findings: what the audit flags, each with the numbers behind it and the threshold it crossed.

Per workload that still holds its card at the window's end:
- `idle`: no compute (engine activity < `idle_compute`) for the last `idle_for_s`;
- `idle_held`: memory held (median >= `held_mem_mib`) while compute stays ~0 (p95 below
  `idle_compute`) over the whole window;
- `oversized_memory`: the recommended memory (`recommend.py`: p99, max for batch, x headroom,
  on the grid) is below the allocation by at least one slice step;
- `oversized_compute`: p95 compute share below `oversized_compute_ratio` of the allocated cores;
- `zero_traffic`: an inference deployment none of whose instances served a request in the window
  (needs the gateway's traffic);
per node:
- `fragmented`: the scheduler's fragmentation measure (`WorkloadMix.fragmentation`, FGD's F) under
  the estate's own request shapes: the expected free gpu_milli an arriving request cannot use
  there is at least `fragmented_milli`.
Pure: statistics and settings in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gpuplane.audit.estate import AuditEstate, Held, request
from gpuplane.audit.recommend import Recommendation
from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import FleetStats, WorkloadStat
from gpuplane.control.scheduler import MILLI_PER_GPU, WorkloadMix

GIB = 1024


class FindingKind(StrEnum):
    IDLE = "idle"
    IDLE_HELD = "idle_held"
    OVERSIZED_MEMORY = "oversized_memory"
    OVERSIZED_COMPUTE = "oversized_compute"
    ZERO_TRAFFIC = "zero_traffic"
    FRAGMENTED = "fragmented"


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding about a workload (or, for `fragmented`, a node)."""

    kind: FindingKind
    subject: str  # the workload, or the node
    team: str
    node: str
    message: str
    numbers: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def to_json(self) -> dict[str, object]:
        return {
            "kind": str(self.kind),
            "subject": self.subject,
            "team": self.team,
            "node": self.node,
            "message": self.message,
            "numbers": dict(self.numbers),
        }


def current(stats: FleetStats) -> list[WorkloadStat]:
    """The workloads that still hold their card when the window ends."""
    w = stats.window
    return [s for s in stats.workloads if s.last_s >= w.end_s - 2 * w.step_s]


def held_now(stats: FleetStats) -> list[Held]:
    """What every current workload holds, as slices on the estate's cards."""
    return [
        Held(s.workload, s.cluster, s.node, s.card, min(s.alloc_mem_mib, s.card_mem_mib),
             MILLI_PER_GPU if s.alloc_share >= 1 else s.alloc_cores_pct * 10, s.gpu_model)
        for s in current(stats)
    ]  # fmt: skip


def find(
    stats: FleetStats,
    recs: Mapping[str, Recommendation],
    settings: AuditSettings,
    traffic: bool,
) -> list[Finding]:
    """Every finding; `traffic` says whether the gateway's traffic was read (zero_traffic)."""
    out: list[Finding] = []
    live = current(stats)
    end = stats.window.end_s
    for s in live:
        out += _workload(s, recs[s.workload], settings, end)
    if traffic:
        out += _zero_traffic(live)
    out += fragmented(stats, settings)
    return out


def _workload(
    s: WorkloadStat, rec: Recommendation, cfg: AuditSettings, end_s: int
) -> list[Finding]:
    out = []

    def add(kind: FindingKind, message: str, **numbers: float) -> None:
        out.append(Finding(kind, s.workload, s.team, s.node, message, MappingProxyType(numbers)))

    idle_min = cfg.idle_for_s // 60
    if (
        s.first_s <= end_s - cfg.idle_for_s
        and s.recent_compute_max is not None
        and s.recent_compute_max < cfg.idle_compute
    ):
        add(
            FindingKind.IDLE,
            f"no compute for the last {idle_min} min (max {s.recent_compute_max:.3f} < "
            f"{cfg.idle_compute})",
            recent_compute_max=s.recent_compute_max,
        )
    if s.mem_p50 >= cfg.held_mem_mib and s.compute_p95 < cfg.idle_compute:
        add(
            FindingKind.IDLE_HELD,
            f"holds {s.mem_p50 / GIB:.1f} GiB with compute ~0 all window "
            f"(p95 {s.compute_p95:.3f} < {cfg.idle_compute})",
            mem_p50_mib=s.mem_p50,
            compute_p95=s.compute_p95,
        )
    step = s.card_mem_mib // cfg.slice_fraction
    if rec.mem_mib <= s.alloc_mem_mib - step:
        add(
            FindingKind.OVERSIZED_MEMORY,
            f"needs {rec.mem_mib / GIB:.0f} GiB (p{'max' if s.kind == 'batch' else '99'} "
            f"{rec.basis_mib / cfg.headroom / GIB:.1f} GiB x {cfg.headroom}) of "
            f"{s.alloc_mem_mib / GIB:.0f} GiB allocated",
            alloc_mem_mib=s.alloc_mem_mib,
            recommended_mem_mib=rec.mem_mib,
        )
    if s.compute_p95 < cfg.oversized_compute_ratio * s.alloc_cores_pct / 100:
        add(
            FindingKind.OVERSIZED_COMPUTE,
            f"p95 compute {s.compute_p95 * 100:.0f} % of the card, under "
            f"{cfg.oversized_compute_ratio:.0%} of the {s.alloc_cores_pct} % allocated",
            compute_p95=s.compute_p95,
            alloc_cores_pct=s.alloc_cores_pct,
        )
    return out


def _zero_traffic(live: Sequence[WorkloadStat]) -> list[Finding]:
    by_dep: dict[str, list[WorkloadStat]] = {}
    for s in live:
        if s.requests is not None:
            by_dep.setdefault(s.deployment or s.workload, []).append(s)
    return [
        Finding(
            FindingKind.ZERO_TRAFFIC,
            s.workload,
            s.team,
            s.node,
            f"deployment {dep} ({len(ws)} instance{'s' if len(ws) > 1 else ''}) served no "
            "request in the window",
            MappingProxyType({"instances": len(ws)}),
        )
        for dep, ws in sorted(by_dep.items())
        if all(s.requests == 0 for s in ws)
        for s in ws
    ]


def fragmented(stats: FleetStats, settings: AuditSettings) -> list[Finding]:
    """Nodes whose free GPU the estate's common request shapes (the classes covering 95 % of
    what is held now) are expected not to be able to use."""
    held = held_now(stats)
    if not held:
        return []
    estate = AuditEstate.of(stats.cards)
    snap = estate.snapshot(held)
    mix = WorkloadMix.from_requests(
        [request(h, estate.card_mem[(h.node, h.card)]) for h in held], popularity=0.95
    )
    if mix.total_weight == 0:
        return []
    frag = mix.fragmentation(snap) / mix.total_weight
    return [
        Finding(
            FindingKind.FRAGMENTED,
            node.name,
            "",  # a node's fragments are the estate's, not one team's
            node.name,
            f"{frag[i]:.0f} gpu_milli free that arriving requests are expected not to use "
            f"(of {int(snap.gpu_milli_free[i])} free; threshold {settings.fragmented_milli})",
            MappingProxyType(
                {"fragment_milli": float(frag[i]), "free_milli": float(snap.gpu_milli_free[i])}
            ),
        )
        for i, node in enumerate(snap.nodes)
        if frag[i] >= settings.fragmented_milli
    ]
