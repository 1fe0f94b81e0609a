"""What the console's pages show, shaped from the queries' views: pure, no request, no store."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gpuplane.control.store.views import NodeView, TeamView


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One GPU model over the pool: cards, GPUs allocated (slices counted as their share), and
    cards wholly free."""

    model: str
    cards: int
    allocated_gpus: float
    free_cards: int


def by_model(nodes: list[NodeView]) -> list[ModelRow]:
    cards: dict[str, list[int]] = defaultdict(list)
    for node in nodes:
        for d in node.devices:
            cards[d.model].append(d.gpu_milli_free)
    return [
        ModelRow(m, len(free), sum(1000 - f for f in free) / 1000, sum(f == 1000 for f in free))
        for m, free in sorted(cards.items())
    ]


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """A team's quota on one flavor: nominal, used, borrowed from its cohort (used beyond
    nominal) and lent to it (its share of the cohort's borrowing, by its idle lendable quota)."""

    team: str
    cohort: str | None
    flavor: str
    nominal_gpus: float
    used_gpus: float
    borrowed_gpus: float
    lent_gpus: float
    borrowing_limit_gpus: float | None
    lending_limit_gpus: float | None


def quota_rows(teams: list[TeamView], shown: set[str] | None) -> list[QuotaRow]:
    """Rows of `teams` (every team: lending is a cohort's sum) for the `shown` ones (None: all)."""
    borrowed: dict[tuple[str | None, str], float] = defaultdict(float)
    idle: dict[tuple[str, str], float] = {}
    idle_sum: dict[tuple[str | None, str], float] = defaultdict(float)
    for t in teams:
        for q in t.quotas:
            borrowed[(t.cohort, q.flavor)] += max(0.0, q.used_gpus - q.gpus)
            spare = max(0.0, q.gpus - q.used_gpus)
            if q.lending_limit_gpus is not None:
                spare = min(spare, q.lending_limit_gpus)
            idle[(t.name, q.flavor)] = spare if t.cohort else 0.0
            idle_sum[(t.cohort, q.flavor)] += idle[(t.name, q.flavor)]
    rows = []
    for t in teams:
        if shown is not None and t.name not in shown:
            continue
        for q in t.quotas:
            key = (t.cohort, q.flavor)
            total = idle_sum[key]
            lent = min(borrowed[key], total) * idle[(t.name, q.flavor)] / total if total else 0.0
            rows.append(
                QuotaRow(
                    t.name,
                    t.cohort,
                    q.flavor,
                    q.gpus,
                    q.used_gpus,
                    max(0.0, q.used_gpus - q.gpus),
                    lent,
                    q.borrowing_limit_gpus,
                    q.lending_limit_gpus,
                )
            )
    return rows


@dataclass(frozen=True, slots=True)
class SliceView:
    """A job's share of one card; `job_id` None: another team's job, not named."""

    job_id: str | None
    label: str
    gpu_milli: int
    mem_mib: int


@dataclass(slots=True)
class CardView:
    index: int
    model: str
    mem_mib: int
    gpu_milli_free: int
    slices: list[SliceView] = field(default_factory=list)


def card_map(
    nodes: list[NodeView], held: list[tuple[str, str, int, SliceView, str]], shown: set[str] | None
) -> list[tuple[NodeView, list[CardView]]]:
    """Each node's cards with their slices; `held`: (cluster, node, card, slice, team) of every
    active job; a slice of a team not `shown` (None: all) keeps its size but not its job."""
    out = []
    for node in nodes:
        cards = {
            d.index: CardView(d.index, d.model, d.mem_mib, d.gpu_milli_free) for d in node.devices
        }
        for cluster, name, index, s, team in held:
            if (cluster, name) == (node.cluster, node.name) and index in cards:
                hidden = shown is not None and team not in shown
                cards[index].slices.append(
                    SliceView(None, "held by another team", s.gpu_milli, s.mem_mib) if hidden else s
                )
        out.append((node, [cards[i] for i in sorted(cards)]))
    return out
