"""The generated fleet's workloads (`fleet.py`): their latent profiles and how they are drawn.

`SeedWorkload` is one workload with the needs its ground truth is labelled from; `WorkloadMaker`
draws the deployments, data jobs and fragmenting remnants of an estate from one RNG, in a fixed
order, so a seed always gives the same workloads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuplane.control.scheduler import NodeInfo

TEAMS = (
    "search", "ads", "maps", "feeds", "video", "music", "mail", "shop", "pay", "travel",
    "news", "games", "cloud", "health", "edu", "auto", "home", "photo", "docs", "social",
)  # fmt: skip
PURPOSES = ("chat", "embed", "rerank", "asr", "ocr", "moderation", "summarise", "translate")
GIB = 1024
# inference deployment profiles and their shares of the deployments
PROFILES = {"small": 0.68, "medium": 0.15, "heavy": 0.08, "dead": 0.07, "stalled": 0.02}


@dataclass(frozen=True, slots=True)
class SeedWorkload:
    """One workload of the generated fleet: where it runs, what it holds, its latent needs."""

    name: str
    team: str
    kind: str  # "inference" | "batch"
    deployment: str  # the inference deployment ("" for a data job)
    profile: str
    node: str
    card: int
    alloc_mem_mib: int
    alloc_cores_pct: int
    weights_mib: float  # memory held whatever the load
    kv_mib: float  # memory that grows with load, up to this at full load
    compute_peak: float  # compute share of the card at full load
    theta: float  # diurnal cut: load is 0 while the diurnal curve is below it
    phase_h: float  # hour the diurnal curve crosses its midpoint rising
    stop_s: float  # unix time it stops computing (inf: never)
    rps: float  # requests per second at full load (0 for data jobs and dead deployments)


class WorkloadMaker:
    """Draws workloads' latent profiles for `fleet.generate` (one RNG, in a fixed order)."""

    def __init__(self, rng: np.random.Generator, card_mem: int, start: int, end: int) -> None:
        self.rng, self.card_mem, self.start, self.end = rng, card_mem, start, end
        self.jobs = 0

    def deployments(self, cards: list[tuple[str, int]]) -> list[SeedWorkload]:
        rng, k = self.rng, 0
        out: list[SeedWorkload] = []
        names = list(PROFILES)
        shares = np.array(list(PROFILES.values()))
        while k < len(cards):
            team = str(rng.choice(TEAMS))
            profile = str(rng.choice(names, p=shares / shares.sum()))
            size = min(int(rng.integers(1, 7)), len(cards) - k)
            dep = f"{team}-{rng.choice(PURPOSES)}-{len(out)}"
            base = self._inference_profile(profile)
            for i in range(size):
                node, card = cards[k]
                jitter = rng.uniform(0.85, 1.15)
                weights, kv, peak, rps = base
                stop = math.inf
                if profile == "stalled":
                    stop = self.end - rng.uniform(1.0, 12.0) * 3600
                out.append(
                    SeedWorkload(
                        name=f"{dep}-{i}",
                        team=team,
                        kind="inference",
                        deployment=dep,
                        profile=profile,
                        node=node,
                        card=card,
                        alloc_mem_mib=self.card_mem,
                        alloc_cores_pct=100,
                        weights_mib=min(weights * jitter, self.card_mem * 0.6),
                        kv_mib=kv * jitter,
                        compute_peak=min(peak * jitter, 0.98),
                        theta=float(rng.uniform(0.0, 0.5)),
                        phase_h=float(9 + rng.uniform(-2, 2)),
                        stop_s=stop,
                        rps=rps,
                    )
                )
                k += 1
        return out

    def _inference_profile(self, profile: str) -> tuple[float, float, float, float]:
        """(weights MiB, KV MiB at full load, compute peak, requests/s at full load)."""
        rng = self.rng
        if profile in ("small", "dead", "stalled"):
            weights = float(np.clip(rng.lognormal(math.log(3.5 * GIB), 0.5), 0.6 * GIB, 7 * GIB))
            kv = weights * rng.uniform(0.2, 0.6)
            peak = float(np.clip(rng.lognormal(math.log(0.08), 0.6), 0.02, 0.3))
        elif profile == "medium":
            weights = rng.uniform(9, 20) * GIB
            kv = weights * rng.uniform(0.3, 0.6)
            peak = rng.uniform(0.2, 0.45)
        else:  # heavy
            weights = rng.uniform(35, 50) * GIB
            kv = rng.uniform(12, 22) * GIB
            peak = rng.uniform(0.6, 0.95)
        if profile == "dead":  # the model stays loaded; nothing asks it anything
            return float(weights), 0.0, 0.0, 0.0
        return float(weights), float(kv), float(peak), float(rng.lognormal(math.log(4.0), 0.8))

    def data_jobs(self, cards: list[tuple[str, int]]) -> list[SeedWorkload]:
        """Whole-card jobs (busy, or stalled: done computing but holding the card), and cards
        shared by two fractional jobs that fill them exactly."""
        rng = self.rng
        out: list[SeedWorkload] = []
        for node, card in cards:
            kind = rng.choice(["busy", "stalled", "shared"], p=[0.5, 0.25, 0.25])
            if kind == "shared":
                first = int(rng.choice([25, 50, 75]))
                for pct in (first, 100 - first):
                    out.append(self._job(node, card, pct, "shared"))
            else:
                out.append(self._job(node, card, 100, str(kind)))
        return out

    def remnant_jobs(self, node: NodeInfo) -> list[SeedWorkload]:
        """A fragmented node: each card holds a job of 80-90 % of it, leaving a remnant smaller
        than any request shape of the estate."""
        return [
            self._job(node.name, d.index, int(self.rng.choice([80, 82, 85, 88, 90])), "busy")
            for d in node.devices
        ]

    def _job(self, node: str, card: int, pct: int, profile: str) -> SeedWorkload:
        rng = self.rng
        team = str(rng.choice(TEAMS))
        self.jobs += 1
        alloc_mem = self.card_mem * pct // 100
        used = rng.uniform(0.15, 0.9) * alloc_mem
        peak = rng.uniform(0.25, 0.95) * pct / 100
        stop = math.inf
        if profile == "stalled":
            stop = self.end - rng.uniform(1.0, 48.0) * 3600
        return SeedWorkload(
            name=f"{team}-job-{self.jobs}",
            team=team,
            kind="batch",
            deployment="",
            profile=profile,
            node=node,
            card=card,
            alloc_mem_mib=alloc_mem,
            alloc_cores_pct=pct,
            weights_mib=used * 0.6,
            kv_mib=used * 0.4,
            compute_peak=peak,
            theta=0.0,
            phase_h=0.0,
            stop_s=stop,
            rps=0.0,
        )


# -- Arrow helpers -------------------------------------------------------------------------------
