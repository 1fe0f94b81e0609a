"""Filter: which nodes (and, for a share, which cards) could host a request, as `Candidates`.

Pure reads of a `State`: the snapshot's free resources (`free_state`), its capacity with nothing
running (`capacity_state`: submit-time feasibility), or the free resources with nominated nodes'
holds taken off (`nomination.held_state`). Per-node aggregates first, then card by card on the
survivors only, so a filter costs O(nodes) plus O(survivors x cards).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuplane.control.scheduler.base import Candidates
from gpuplane.control.scheduler.decision import MILLI_PER_GPU, BoolArray, IntArray, Request
from gpuplane.control.scheduler.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class State:
    """The resource arrays the filter reads: free resources, or capacity (nothing running)."""

    cpu: IntArray
    mem: IntArray
    dev_milli: IntArray
    dev_mem: IntArray
    full_free: IntArray
    max_milli: IntArray
    max_mem: IntArray


def free_state(s: Snapshot) -> State:
    return State(
        s.cpu_free,
        s.mem_free,
        s.dev_milli_free,
        s.dev_mem_free,
        s.full_free,
        s.max_milli_free,
        s.max_mem_free,
    )


def capacity_state(s: Snapshot) -> State:
    return State(
        s.cpu_cap,
        s.mem_cap,
        s.dev_milli_cap,
        s.dev_mem_cap,
        s.n_devices,
        np.where(s.n_devices > 0, MILLI_PER_GPU, 0),
        s.max_card_mem,
    )


def filter_when_empty(snapshot: Snapshot, request: Request) -> Candidates:
    """The filter phase against the estate with nothing running: where `request` could ever
    fit (submit-time feasibility, nominated nodes, the GPU models a request may use)."""
    return filter_nodes(snapshot, request, capacity_state(snapshot))


def filter_nodes(snapshot: Snapshot, request: Request, state: State) -> Candidates:
    """The filter phase over per-node aggregates first, then card by card on the survivors."""
    ok: BoolArray = snapshot.schedulable & snapshot.selector_mask(request.selector)
    if request.cpu_millis:
        ok &= state.cpu >= request.cpu_millis
    if request.memory_mib:
        ok &= state.mem >= request.memory_mib
    if request.gpus:
        ok &= state.full_free >= request.gpus
    elif request.is_fractional:
        ok &= snapshot.splittable & (state.max_milli >= request.gpu_milli)
        if request.gpu_mem_mib is not None:
            ok &= state.max_mem >= request.gpu_mem_mib
    rows: IntArray = np.flatnonzero(ok)
    if not request.is_fractional or len(rows) == 0:
        return Candidates(snapshot, request, rows)
    card_mem = request.mem_on(snapshot.dev_mem_cap[rows])
    fit = snapshot.dev_exists[rows] & (state.dev_milli[rows] >= request.gpu_milli)
    fit &= state.dev_mem[rows] >= card_mem
    keep = fit.any(axis=1)
    if not keep.all():
        rows, fit, card_mem = rows[keep], fit[keep], card_mem[keep]
    return Candidates(snapshot, request, rows, fit, card_mem)
