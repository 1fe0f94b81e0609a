"""The audit's routes on the control API: `GET /usage`, the usage report (`usage_report.py`).

The composition root (`plane.control_app`) mounts them and hands them a `UsageSource`, the
little of the control plane they read: the holdings in its store, its clock and samples dir, and
which teams the caller may see. So the audit imports no control API, auth or store, and the
control API imports no audit. The route's row of `auth.POLICY` is checked before it runs, as
every route's is.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from fastapi import APIRouter, Query, Request

from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.usage_report import Holdings, report, span


class UsageSource(Protocol):
    """What the usage report reads of the control plane."""

    @property
    def holdings(self) -> Holdings:
        """The store's cards and their holdings over a window."""

    @property
    def samples_dir(self) -> str | None:
        """`control.samples_dir`: the audit sample store that measured use, if any."""

    def clock(self) -> float:
        """The service's time (unix seconds)."""

    def teams(self, request: Request, team: str | None) -> Collection[str] | None:
        """The teams the caller of `request` is shown (None: every team); with `team`, that
        one only, refused as unknown (404) when it is not the caller's."""


def usage_router(source: UsageSource, audit: AuditSettings) -> APIRouter:
    """The `/usage` route over `source`; `audit`: the config's `audit:` section (prices)."""
    router = APIRouter()

    @router.get("/usage")
    def usage_report(
        request: Request,
        since: str = Query("7d", description="start: a duration ago (7d, 12h) or an ISO time"),
        until: str | None = Query(None, description="end, the same way; default: now"),
        step: str = Query("60s", description="allocations are counted once per this"),
        team: str | None = Query(None, description="this team only"),
    ) -> dict[str, Any]:
        """GPU-hours, slice-hours and cost per team and GPU model (a slice counts its share of
        the card), used and idle apart where `control.samples_dir` measured them."""
        teams = source.teams(request, team)
        window = span(since, until, step, source.clock())
        return report(source.holdings, window, audit, source.samples_dir, teams)

    return router
