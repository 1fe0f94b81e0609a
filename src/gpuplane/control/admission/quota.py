"""Team quota arithmetic, Kueue-style, with no I/O: nominal quota, borrowing, dominant shares.

Vocabulary (Kueue's; see docs/architecture.md): each team submits through its LocalQueue into
its own ClusterQueue; a ResourceFlavor is a GPU model; a Cohort is a set of ClusterQueues that
lend each other their unused nominal quota. Quota is counted in two resources per flavor:
milli-GPUs (1000 = one card; a slice counts max(compute share, memory share) of the card) and
GPU memory in MiB.

Admission is two steps, as in Kueue: `QuotaBook.check` answers whether the quota can be reserved
(and whether that means borrowing), the scheduler then finds a place, and only then does the
service `reserve` the quota together with the placement, in one transaction. A team with no quota
at all is not limited (its usage still counts toward fair share); a team with quotas may only use
the flavors it has quota for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from gpuplane.control.scheduler import MILLI_PER_GPU, Request


@dataclass(frozen=True, slots=True)
class Amount:
    """Quota resources of one flavor: milli-GPUs and GPU memory (MiB)."""

    gpu_milli: int = 0
    mem_mib: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.gpu_milli + other.gpu_milli, self.mem_mib + other.mem_mib)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.gpu_milli - other.gpu_milli, self.mem_mib - other.mem_mib)


def charge(request: Request, card_mem_mib: int) -> Amount:
    """What `request` counts against quota on a flavor whose cards have `card_mem_mib`."""
    if request.gpus:
        return Amount(request.gpus * MILLI_PER_GPU, request.gpus * card_mem_mib)
    if not request.is_fractional:
        return Amount()
    mem = request.mem_on(card_mem_mib)
    by_mem = math.ceil(MILLI_PER_GPU * mem / card_mem_mib) if card_mem_mib else 0
    return Amount(min(MILLI_PER_GPU, max(request.gpu_milli, by_mem)), mem)


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """Nominal quota, borrowing and lending limits on one flavor; None means unlimited.

    A lending limit L keeps `nominal - L` of the team's quota for itself: the cohort may only
    borrow up to L of it (Kueue's lendingLimit)."""

    nominal_gpu_milli: int
    nominal_mem_mib: int | None = None
    borrowing_limit_gpu_milli: int | None = None
    borrowing_limit_mem_mib: int | None = None
    lending_limit_gpu_milli: int | None = None
    lending_limit_mem_mib: int | None = None

    def nominal(self, resource: str) -> int | None:
        return self.nominal_gpu_milli if resource == "gpu_milli" else self.nominal_mem_mib

    def borrowing_limit(self, resource: str) -> int | None:
        if resource == "gpu_milli":
            return self.borrowing_limit_gpu_milli
        return self.borrowing_limit_mem_mib

    def lendable(self, resource: str) -> int | None:
        """How much of the nominal quota the cohort may use (None: unlimited nominal)."""
        nominal = self.nominal(resource)
        if nominal is None:
            return None
        limit = (
            self.lending_limit_gpu_milli if resource == "gpu_milli" else self.lending_limit_mem_mib
        )
        return nominal if limit is None else min(limit, nominal)

    def guaranteed(self, resource: str) -> int:
        """The part of the nominal quota that is never lent."""
        return (self.nominal(resource) or 0) - (self.lendable(resource) or 0)


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """A team's ClusterQueue: its cohort, fair-share weight and quota per flavor."""

    name: str
    cohort: str | None = None
    weight: float = 1.0
    flavors: Mapping[str, FlavorQuota] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def limited(self) -> bool:
        return bool(self.flavors)


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    """The answer of `QuotaBook.check`: may the quota be reserved, by borrowing or not, why not."""

    ok: bool
    borrowing: bool = False
    reason: str = ""
    numbers: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


_RESOURCES = ("gpu_milli", "mem_mib")


def format_gpus(milli: int) -> str:
    """Milli-GPUs in the unit users give quotas and requests in: `1.5 GPUs`, `1 GPU`."""
    gpus = milli / MILLI_PER_GPU
    return f"{gpus:g} GPU" + ("" if gpus == 1 else "s")


def format_amount(resource: str, value: int) -> str:
    """One quota resource's value as reasons and messages show it (`1.5 GPUs`, `10240 MiB`)."""
    return format_gpus(value) if resource == "gpu_milli" else f"{value} MiB of GPU memory"


class QuotaBook:
    """Quota definitions plus usage per (team, flavor), with reservations keyed by job id."""

    def __init__(self, teams: Iterable[TeamQuota] = ()) -> None:
        self.teams: dict[str, TeamQuota] = {t.name: t for t in teams}
        self._usage: dict[tuple[str, str], Amount] = {}
        self._totals: dict[str, Amount] = {}  # per team, over flavors (fair share reads it often)
        self._jobs: dict[str, tuple[str, str, Amount]] = {}

    def copy(self) -> QuotaBook:
        other = QuotaBook(self.teams.values())
        other._usage = dict(self._usage)
        other._totals = dict(self._totals)
        other._jobs = dict(self._jobs)
        return other

    def team(self, name: str) -> TeamQuota:
        return self.teams.get(name) or TeamQuota(name)

    def usage(self, team: str, flavor: str) -> Amount:
        return self._usage.get((team, flavor), Amount())

    def team_total(self, team: str) -> Amount:
        return self._totals.get(team, Amount())

    def cohort_members(self, cohort: str) -> list[TeamQuota]:
        return [t for t in self.teams.values() if t.cohort == cohort]

    def reservation(self, job_id: str) -> tuple[str, str, Amount] | None:
        return self._jobs.get(job_id)

    # -- ask ---------------------------------------------------------------------------------

    def check(self, team: str, flavor: str, amount: Amount) -> QuotaDecision:
        """Can `team` reserve `amount` of `flavor` now? Pure."""
        tq = self.team(team)
        if not tq.limited:
            return QuotaDecision(ok=True)
        fq = tq.flavors.get(flavor)
        if fq is None:
            return QuotaDecision(
                ok=False,
                reason=f"team {team} has no quota for GPU model {flavor} (it has: "
                f"{', '.join(sorted(tq.flavors))}); add one with `gpuplane quota set`",
            )
        used = self.usage(team, flavor)
        borrowing = False
        for resource in _RESOURCES:
            nominal = fq.nominal(resource)
            if nominal is None:
                continue
            want = getattr(used, resource) + getattr(amount, resource)
            if want <= nominal:
                continue
            borrow = want - nominal
            fmt = partial(format_amount, resource)
            nums = {
                "requested": getattr(amount, resource),
                "used": getattr(used, resource),
                "nominal": nominal,
            }
            if tq.cohort is None:
                return _no(
                    f"team {team} would use {fmt(want)} of its nominal {fmt(nominal)} on "
                    f"{flavor} and has no cohort to borrow from",
                    nums,
                )
            limit = fq.borrowing_limit(resource)
            if limit is not None and borrow > limit:
                return _no(
                    f"team {team} would borrow {fmt(borrow)} on {flavor}, over its "
                    f"borrowing limit of {fmt(limit)}",
                    {**nums, "borrowing_limit": limit},
                )
            pool = self._cohort_unused(tq.cohort, flavor, resource)
            # what this request adds to the cohort's shared usage (beyond the guaranteed part)
            g = fq.guaranteed(resource)
            delta = max(0, want - g) - max(0, getattr(used, resource) - g)
            if pool is not None and delta > pool:
                return _no(
                    f"cohort {tq.cohort} has {fmt(max(pool, 0))} of unused quota on "
                    f"{flavor}; team {team} needs {fmt(delta)}",
                    {**nums, "cohort_unused": max(pool, 0)},
                )
            borrowing = True
        return QuotaDecision(ok=True, borrowing=borrowing)

    def _cohort_unused(self, cohort: str, flavor: str, resource: str) -> int | None:
        """Lendable quota minus what members use beyond their guaranteed part, over the cohort
        (None: some member's nominal quota is unlimited)."""
        total = 0
        for member in self.cohort_members(cohort):
            fq = member.flavors.get(flavor)
            if fq is None:
                lendable, guaranteed = 0, 0
            else:
                lendable_or_none = fq.lendable(resource)
                if lendable_or_none is None:
                    return None
                lendable, guaranteed = lendable_or_none, fq.guaranteed(resource)
            used = getattr(self.usage(member.name, flavor), resource)
            total += lendable - max(0, used - guaranteed)
        return total

    def borrowing(self, team: str, flavor: str) -> bool:
        """Does `team` use more than its nominal quota of `flavor` now?"""
        fq = self.team(team).flavors.get(flavor)
        if fq is None:
            return False
        used = self.usage(team, flavor)
        return any((n := fq.nominal(r)) is not None and getattr(used, r) > n for r in _RESOURCES)

    # -- commit ------------------------------------------------------------------------------

    def reserve(self, job_id: str, team: str, flavor: str, amount: Amount) -> None:
        """Count `amount` against `team` for `job_id` (replacing an earlier reservation)."""
        self.release(job_id)
        self._jobs[job_id] = (team, flavor, amount)
        self._usage[(team, flavor)] = self.usage(team, flavor) + amount
        self._totals[team] = self.team_total(team) + amount

    def release(self, job_id: str) -> None:
        """Give back `job_id`'s reservation. Idempotent, never raises."""
        held = self._jobs.pop(job_id, None)
        if held is not None:
            team, flavor, amount = held
            self._usage[(team, flavor)] = self.usage(team, flavor) - amount
            self._totals[team] = self.team_total(team) - amount


def _no(reason: str, numbers: Mapping[str, int]) -> QuotaDecision:
    return QuotaDecision(ok=False, reason=reason, numbers=MappingProxyType(dict(numbers)))


def dominant_share(used: Amount, capacity: Amount, weight: float = 1.0) -> float:
    """Dominant-resource share of `used` in `capacity`, divided by the team's weight."""
    shares = [
        getattr(used, r) / getattr(capacity, r) for r in _RESOURCES if getattr(capacity, r) > 0
    ]
    return max(shares, default=0.0) / weight
