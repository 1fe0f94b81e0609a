"""The re-pack plan: right-sized slices packed through the scheduler core, and the cards freed.

Steps, all on one `Snapshot` through the public core (`schedule` then `commit`, `release`):
1. every workload still holding a card is resized in place to its recommendation (never larger
   than what it holds: a re-pack only gives back); dead deployments (zero_traffic and
   idle_held) are retired when `retire_dead` is set;
2. cards nobody holds are blocked (a placeholder takes them whole), so nothing lands on them;
3. cards are drained from the least held up: the card's workloads are released, the card is
   blocked, and each is placed again by the configured policy (`frag` by default: the same
   policy and scoring that place jobs); if one does not fit, the drain is undone (release what
   was placed, commit the originals back) and the card stays. A card that received a workload
   is never drained, so each workload moves at most once, and a card holding a whole-card
   workload is not drained (moving it frees nothing).
Moves are ordered by savings per move: retirements (one card each) first, then drains by cards
freed per workload moved. The final placements are committed again on a fresh snapshot of the
estate: `violations` counts any the core refuses (over-booked card, wrong GPU model).

The plan id is a digest of its inputs: the settings, the window, every workload's placement and
recommendation. `apply` refuses a plan whose inputs have changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpuplane.audit.estate import AuditEstate, Held, request
from gpuplane.audit.findings import Finding, FindingKind, held_now
from gpuplane.audit.recommend import Recommendation
from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import FleetStats
from gpuplane.control.scheduler import (
    DEFAULT_POLICY,
    MILLI_PER_GPU,
    DeviceGrant,
    Placement,
    Policy,
    SchedulingConflict,
    Snapshot,
    policy_class,
    schedule,
)

_BLOCK = "\0block"  # job ids of the placeholders that keep a card empty while planning


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One step of the plan. `action`: retire (free its card), resize (same card, new slice) or
    move (to another card, with the new slice)."""

    action: str
    workload: str
    team: str
    kind: str
    from_node: str
    from_card: str
    to_node: str
    to_card: str
    mem_mib: int
    gpu_milli: int
    saving: float  # cards freed per move by the step it belongs to
    to_cluster: str  # the target node's cluster (`apply` names the node in it)


@dataclass(frozen=True, slots=True)
class RepackPlan:
    """What the re-pack does and what it frees; `id` names it for `apply`."""

    id: str
    policy: str
    cards: int
    held_before: int
    held_after: int
    moves: tuple[PlanStep, ...]
    violations: int
    before: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # card -> workloads
    after: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    placements: Mapping[str, tuple[str, str, str, int, int]] = field(default_factory=dict)
    card_mem: Mapping[str, int] = field(default_factory=dict)  # every card -> its memory (MiB)

    @property
    def freed(self) -> int:
        return self.held_before - self.held_after

    @property
    def freed_ratio(self) -> float:
        return self.freed / self.held_before if self.held_before else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "policy": self.policy,
            "cards": self.cards,
            "held_before": self.held_before,
            "held_after": self.held_after,
            "freed": self.freed,
            "freed_ratio": round(self.freed_ratio, 4),
            "violations": self.violations,
            "moves": [asdict(m) for m in self.moves],
            "placements": {k: list(v) for k, v in self.placements.items()},
        }


def inputs_digest(
    stats: FleetStats, recs: Mapping[str, Recommendation], settings: AuditSettings
) -> str:
    """The plan id: sha256 over what the plan depends on (first 16 hex digits)."""
    held = sorted(
        (h.workload, h.cluster, h.node, h.card, h.mem_mib, h.gpu_milli) for h in held_now(stats)
    )
    sizes = sorted((r.workload, r.mem_mib, r.cores_pct) for r in recs.values())
    body = json.dumps(
        [settings.model_dump(mode="json"), asdict(stats.window), held, sizes], sort_keys=True
    )
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def placement_key(h: Held) -> tuple[str, str, str, int, int]:
    return (h.cluster, h.node, h.card, h.mem_mib, h.gpu_milli)


def make_plan(
    stats: FleetStats,
    recs: Mapping[str, Recommendation],
    findings: Sequence[Finding],
    settings: AuditSettings,
    seed: int = 0,
) -> RepackPlan:
    """The re-pack plan for the estate `stats` describes (pure; `seed` feeds the policy's ties)."""
    estate = AuditEstate.of(stats.cards)
    held = held_now(stats)
    flags: dict[str, set[FindingKind]] = {}
    for f in findings:
        flags.setdefault(f.subject, set()).add(f.kind)
    dead = {FindingKind.ZERO_TRAFFIC, FindingKind.IDLE_HELD}
    moves: list[PlanStep] = []
    kept: list[Held] = []
    info = {s.workload: s for s in stats.workloads}
    for h in held:
        s = info[h.workload]
        if settings.retire_dead and dead <= flags.get(h.workload, set()):
            moves.append(_move("retire", h, h, s.team, s.kind, 1.0))
            continue
        r = recs[h.workload]
        new = Held(h.workload, h.cluster, h.node, h.card, min(r.mem_mib, h.mem_mib),
                   min(r.gpu_milli, h.gpu_milli), h.gpu_model)  # fmt: skip
        if (new.mem_mib, new.gpu_milli) != (h.mem_mib, h.gpu_milli):
            moves.append(_move("resize", h, new, s.team, s.kind, 0.0))
        kept.append(new)
    snap = estate.snapshot(kept)
    mem = {(h.node, h.card): estate.card_mem[(h.node, h.card)] for h in kept}
    policy_name = settings.policy or DEFAULT_POLICY
    policy = policy_class(policy_name).for_mix([request(h, mem[(h.node, h.card)]) for h in kept])
    rng = np.random.default_rng(seed)
    for node in snap.nodes:  # block the cards nobody holds: nothing is moved onto them
        for d in node.devices:
            _block(snap, node.name, d.index)
    by_card: dict[tuple[str, int], list[Placement]] = {}
    for p in snap.allocations.values():
        if not p.job_id.startswith(_BLOCK):
            by_card.setdefault((p.node, p.devices[0].index), []).append(p)
    targets: set[tuple[str, int]] = set()
    drains: list[list[PlanStep]] = []
    kind_of = {h.workload: h for h in kept}
    for key, ps in sorted(by_card.items(), key=lambda kv: (_load(kv[1]), len(kv[1]), kv[0])):
        if key in targets or any(p.devices[0].gpu_milli >= MILLI_PER_GPU for p in ps):
            continue
        placed = _drain(snap, key, ps, kind_of, mem, policy, rng)
        if placed is None:
            continue
        step = []
        for old, dest in zip(ps, placed, strict=True):
            targets.add((dest.node, dest.devices[0].index))
            w = info[old.job_id]
            step.append(
                _move(
                    "move", estate.held_of(old), estate.held_of(dest), w.team, w.kind, 1 / len(ps)
                )
            )
        drains.append(step)
    final = [p for p in snap.allocations.values() if not p.job_id.startswith(_BLOCK)]
    after = [_gpu_model(estate.held_of(p), kind_of[p.job_id]) for p in final]
    drains.sort(key=lambda step: -step[0].saving)  # stable: least held first among equals
    ordered = [m for m in moves if m.action == "retire"]
    ordered += [m for step in drains for m in step]
    ordered += [m for m in moves if m.action == "resize"]
    return RepackPlan(
        id=inputs_digest(stats, recs, settings),
        policy=policy_name,
        cards=sum(len(n.devices) for n in estate.nodes),
        held_before=len({(h.node, h.card) for h in held}),
        held_after=len({(h.node, h.card) for h in after}),
        moves=tuple(ordered),
        violations=violations(estate, after),
        before=_card_map(held),
        after=_card_map(after),
        placements={h.workload: placement_key(h) for h in held},
        card_mem={card: m for (_, card), m in estate.card_mem.items()},
    )


def violations(estate: AuditEstate, held: Sequence[Held]) -> int:
    """Placements a fresh snapshot of the estate refuses, committed one by one: over-booked
    cards, unknown cards, or a GPU model other than the workload's."""
    snap = Snapshot(estate.nodes)
    bad = 0
    for h in held:
        p = estate.placement(h)
        if h.gpu_model and snap.model_of(h.node) != h.gpu_model:
            bad += 1
            continue
        try:
            snap.commit(p)
        except SchedulingConflict:
            bad += 1
    return bad


def _drain(
    snap: Snapshot,
    key: tuple[str, int],
    ps: list[Placement],
    held: Mapping[str, Held],
    mem: Mapping[tuple[str, str], int],
    policy: Policy,
    rng: np.random.Generator,
) -> list[Placement] | None:
    """Move every placement off card `key`, through schedule + commit; None (and the snapshot
    as it was) when one does not fit elsewhere."""
    for p in ps:
        snap.release(p.job_id)
    _block(snap, *key)
    placed: list[Placement] = []
    for p in ps:
        h = held[p.job_id]
        decision = schedule(snap, request(h, mem[(h.node, h.card)]), policy, rng)
        if decision.placement is None:
            break
        snap.commit(decision.placement)
        placed.append(decision.placement)
    if len(placed) == len(ps):
        return placed
    for q in placed:
        snap.release(q.job_id)
    snap.release(f"{_BLOCK}/{key[0]}/{key[1]}")
    for p in ps:
        snap.commit(p)
    return None


def _block(snap: Snapshot, node: str, index: int) -> None:
    """Take whatever is free on a wholly free card, so the plan puts nothing there."""
    i = snap.index[node]
    if not (
        snap.dev_milli_free[i, index] == MILLI_PER_GPU
        and snap.dev_mem_free[i, index] == snap.dev_mem_cap[i, index]
    ):
        return
    grant = DeviceGrant(index, int(snap.dev_mem_cap[i, index]), MILLI_PER_GPU)
    cluster = snap.nodes[i].cluster
    snap.commit(Placement(f"{_BLOCK}/{node}/{index}", cluster, node, (grant,), 0, 0))


def _load(ps: list[Placement]) -> float:
    return sum(max(p.devices[0].gpu_milli, 1) for p in ps)


def _gpu_model(h: Held, old: Held) -> Held:
    return Held(h.workload, h.cluster, h.node, h.card, h.mem_mib, h.gpu_milli, old.gpu_model)


def _move(action: str, old: Held, new: Held, team: str, kind: str, saving: float) -> PlanStep:
    return PlanStep(action, old.workload, team, kind, old.node, old.card, new.node, new.card,
                new.mem_mib, new.gpu_milli, saving, new.cluster)  # fmt: skip


def _card_map(held: Sequence[Held]) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for h in held:
        out.setdefault(h.card, []).append(h.workload)
    return {k: tuple(sorted(v)) for k, v in sorted(out.items())}
