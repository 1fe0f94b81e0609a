"""Filter and score: the scheduler core asked for one request against the other jobs' nominations.

A shape that did not fit is remembered until capacity is freed (`Estate.no_fit`): until then
free capacity only shrinks, so every later job of that shape is answered without a search.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from gpuplane.control.admission.estate import Estate
from gpuplane.control.admission.reasons import PendingReason, from_scheduler
from gpuplane.control.scheduler import Decision, Policy, Request, schedule
from gpuplane.resources import Selector


def place(
    estate: Estate, request: Request, policy: Policy, rng: np.random.Generator, now: float
) -> tuple[Decision, tuple[PendingReason, ...]]:
    """`schedule` against the node nominations of other jobs (less those its time limit lets
    it backfill), and its reasons; skipped when the same shape, free of the same nominations,
    already failed since capacity was last freed: until then free capacity only shrinks (a
    job's own nomination changes what it may use, so a holder is always scheduled). The
    reasons of a failed shape are shared by every job of that shape."""
    others = estate.nominations_against(request, now)
    if request.job_id in estate.nominated:
        decision = schedule(estate.snapshot, request, policy, rng, others)
        return decision, from_scheduler(decision.reasons)
    sel = request.selector
    key = (
        request.gpus,
        request.gpu_milli,
        request.gpu_mem_mib,
        request.cpu_millis,
        request.memory_mib,
        tuple(sorted(sel.match_labels.items())),
        sel.gpu_models,
        # the nominated nodes its time limit lets it backfill (none for most jobs: one entry)
        tuple(sorted({n.node for n in estate.nominated.values()} - {n.node for n in others})),
    )
    known = estate.no_fit.get(key)
    if known is not None and known[0] == estate.freed:
        return known[1], known[2]
    decision = schedule(estate.snapshot, request, policy, rng, others)
    if decision.ok:
        return decision, ()
    why = from_scheduler(decision.reasons)
    estate.no_fit[key] = (estate.freed, decision, why)
    return decision, why


def on_models(request: Request, models: Iterable[str]) -> Request:
    """`request` restricted to the GPU models `models`."""
    selector = Selector(request.selector.match_labels, frozenset(models))
    return replace(request, selector=selector)
