"""The `audit:` settings: finding thresholds, the slice grid, the re-pack policy and GPU prices.

Every threshold a finding uses is here, and the report prints this section as it was applied, so a
reader sees why a workload was flagged. Defaults follow the issue (engine activity < 0.01 for
30 minutes is idle; 1/8 of a card is the slice step) and HAMi's units (`gpu_cores_pct`).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from gpuplane.sections import Section, passes

# A100-80GB MIG profiles ("<g>g.<GiB>gb": g of the card's 7 compute slices, that much memory)
_MIG = re.compile(r"^(\d)g\.(\d+)gb$")


class AuditSettings(Section):
    """What `gpuplane audit` flags and how it sizes and re-packs."""

    idle_compute: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.01, description="compute share (engine activity) below which a card is idle"
    )
    idle_for_s: Annotated[int, Field(ge=60)] = Field(
        default=1800, description="idle: no compute for at least this long at the window's end"
    )
    held_mem_mib: Annotated[int, Field(ge=1)] = Field(
        default=1024, description="idle_held: median memory used at least this much"
    )
    headroom: Annotated[float, Field(ge=1, le=4)] = Field(
        default=1.2, description="recommended memory = p99 used (max for batch) x headroom"
    )
    slice_fraction: Annotated[int, Field(ge=1, le=64)] = Field(
        default=8, description="the memory grid: 1/slice_fraction of a card"
    )
    mig_profiles: list[str] = Field(
        default_factory=list,
        description="size to these MIG profiles (e.g. 1g.10gb, 2g.20gb) instead of the grid",
    )
    compute_step_pct: Annotated[int, Field(ge=1, le=100)] = Field(
        default=5, description="recommended compute = p95 share rounded up to this step"
    )
    oversized_compute_ratio: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.5, description="oversized_compute: p95 share below this part of the cores"
    )
    fragmented_milli: Annotated[int, Field(ge=1, le=8000)] = Field(
        default=250,
        description="fragmented: expected free gpu_milli of a node an arriving request cannot use",
    )
    retire_dead: bool = Field(
        default=True, description="plan: retire deployments with no traffic that hold cards idle"
    )
    policy: str | None = Field(
        default=None, description="plan: the scheduling policy; default: the scheduler core's"
    )
    prices: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict, description="price of one GPU-hour per GPU model (usage cost)"
    )

    @field_validator("mig_profiles")
    @classmethod
    def _profiles(cls, profiles: list[str]) -> list[str]:
        for p in profiles:
            if not _MIG.match(p):
                raise ValueError(f"MIG profile {p!r} is not '<g>g.<GiB>gb', e.g. '1g.10gb'")
        return profiles

    @field_validator("policy")
    @classmethod
    def _policy(cls, name: str | None) -> str | None:
        if name is not None:
            # the scheduler core imports numpy; only a config that names a policy imports it here
            from gpuplane.control.scheduler import policy_class

            return passes(policy_class, name)
        return name

    def mig(self) -> list[tuple[str, int, int]]:
        """The MIG profiles as (name, compute sevenths, memory MiB), smallest first."""
        out = []
        for p in self.mig_profiles:
            m = _MIG.match(p)
            assert m is not None  # validated above
            out.append((p, int(m.group(1)), int(m.group(2)) * 1024))
        return sorted(out, key=lambda t: (t[2], t[1]))
