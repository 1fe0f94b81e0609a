"""Nominations: a node held for a waiting job, and what it keeps from other jobs while it drains.

A job that has waited too long (the admission decides when) is nominated one node
(`nomination_node`: kube-scheduler's nominated node); every other request is then filtered
against that node's free resources minus what the nominated job needs, so nothing new lands on
what it waits for and the node drains as its jobs end (Volcano's reservation and Slurm's drain
work the same way). Pure: a nomination is a mask over the filter's view (`held_state`), the
snapshot itself never changes.

What a nomination of request r on node i holds from the others:
- CPU and memory: r's, off the node's free CPU and memory;
- whole cards (k): k of the node's wholly free cards; while fewer than k are free, every card of
  the node (any of them may be the next to empty), and when exactly k are free, those;
- a share: the card with the most free memory (then compute), the one closest to fitting it.

Time limits make it EASY backfilling (Lifka 1995; Mu'alem & Feitelson 2001): when every job the
node must wait for has a time limit, the nomination has an expected start (`expected_start`: the
jobs end by their limits, earliest first, until r fits), and a job whose own limit ends by then
may use the node as if it were not held (`blocking`): it is gone before the nominated job could
start, so the node's free cards do not idle while it drains. Without limits there is no expected
start and nothing backfills onto a nominated node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from gpuplane.control.scheduler.decision import (
    MILLI_PER_GPU,
    BoolArray,
    IntArray,
    Placement,
    Request,
)
from gpuplane.control.scheduler.filter import State, filter_when_empty, free_state
from gpuplane.control.scheduler.nodeinfo import wall_seconds
from gpuplane.control.scheduler.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Nomination:
    """Node `node` (a node name) is held for `request` (its job id says for whom). `start_s`:
    when the node is expected to fit it by the time limits of its jobs (`expected_start`), None
    when a job it waits for has none."""

    node: str
    request: Request
    start_s: float | None = None


def expected_start(
    snapshot: Snapshot,
    row: int,
    request: Request,
    jobs: Iterable[Placement],
    ends: Mapping[str, float],
    now: float,
) -> float | None:
    """When `request` is expected to fit on node row `row`, whose running jobs are `jobs`: they
    end by their time limits (`ends`: job id -> wall-clock end), earliest first, giving back what
    they hold, and the first end after which it fits is the answer (`now` if it fits now); None
    when it would need a job without a limit to end."""
    milli = snapshot.dev_milli_free[row].copy()
    mem = snapshot.dev_mem_free[row].copy()
    cpu, memory = int(snapshot.cpu_free[row]), int(snapshot.mem_free[row])
    if _fits(snapshot, row, request, milli, mem, cpu, memory):
        return now
    known = sorted((p for p in jobs if p.job_id in ends), key=lambda p: (ends[p.job_id], p.job_id))
    for placement in known:
        for grant in placement.devices:
            milli[grant.index] += grant.gpu_milli
            mem[grant.index] += grant.mem_mib
        cpu += placement.cpu_millis
        memory += placement.memory_mib
        if _fits(snapshot, row, request, milli, mem, cpu, memory):
            return max(ends[placement.job_id], now)
    return None


def _fits(
    snapshot: Snapshot,
    row: int,
    r: Request,
    milli: IntArray,
    mem: IntArray,
    cpu: int,
    memory: int,
) -> bool:
    """Does `r` fit on node row `row` with these free cards, CPU and memory?"""
    if cpu < r.cpu_millis or memory < r.memory_mib:
        return False
    if r.gpus:
        return int(snapshot.wholly_free(row, milli, mem).sum()) >= r.gpus
    if not r.is_fractional:
        return True
    need = r.mem_on(snapshot.dev_mem_cap[row])
    fit = snapshot.dev_exists[row] & (milli >= r.gpu_milli) & (mem >= need)
    return bool(fit.any())


def blocking(
    snapshot: Snapshot, nominations: Sequence[Nomination], request: Request, now: float
) -> list[Nomination]:
    """The nominations `request` must respect: all but those whose expected start its own time
    limit (in wall-clock seconds on the nominated node's cards) ends by (EASY backfilling)."""
    limit = request.time_limit_s
    if limit is None:
        return list(nominations)
    return [
        n
        for n in nominations
        if n.start_s is None or now + wall_seconds(limit, snapshot.speed_of(n.node)) > n.start_s
    ]


def held_state(snapshot: Snapshot, nominations: Sequence[Nomination]) -> State:
    """The free resources others may use: `free_state` with what every nomination holds taken
    off its node."""
    if not nominations:
        return free_state(snapshot)
    cpu = snapshot.cpu_free.copy()
    mem = snapshot.mem_free.copy()
    full = snapshot.full_free.copy()
    milli = snapshot.dev_milli_free.copy()
    dev_mem = snapshot.dev_mem_free.copy()
    rows = [snapshot.index[n.node] for n in nominations]
    for i, nomination in zip(rows, nominations, strict=True):
        r = nomination.request
        cpu[i] = max(cpu[i] - r.cpu_millis, 0)
        mem[i] = max(mem[i] - r.memory_mib, 0)
        blocked, kept = _held_cards(snapshot, i, r)
        milli[i, blocked] = 0
        dev_mem[i, blocked] = 0
        full[i] = max(int(snapshot.wholly_free(i, milli[i], dev_mem[i]).sum()) - kept, 0)
    max_milli = snapshot.max_milli_free.copy()
    max_mem = snapshot.max_mem_free.copy()
    if snapshot.max_devices:
        max_milli[rows] = milli[rows].max(axis=1)
        max_mem[rows] = dev_mem[rows].max(axis=1)
    return State(cpu, mem, milli, dev_mem, full, max_milli, max_mem)


def _held_cards(snapshot: Snapshot, i: int, r: Request) -> tuple[BoolArray, int]:
    """Which cards of node row `i` the nomination of `r` keeps from every other request, and how
    many of the wholly free cards left it keeps besides (any k of them will do)."""
    exists: BoolArray = snapshot.dev_exists[i]
    if r.gpus:
        whole = snapshot.wholly_free(i, snapshot.dev_milli_free[i], snapshot.dev_mem_free[i])
        spare = int(whole.sum()) - r.gpus
        if spare < 0:
            return exists, 0
        if spare == 0:
            return whole, 0
        return np.zeros_like(exists), r.gpus
    blocked: BoolArray = np.zeros_like(exists)
    if r.is_fractional and exists.any():
        room = snapshot.dev_mem_free[i] * (MILLI_PER_GPU + 1) + snapshot.dev_milli_free[i]
        blocked[int(np.argmax(np.where(exists, room, -1)))] = True
    return blocked, 0


def nomination_node(
    snapshot: Snapshot,
    request: Request,
    taken: Set[str],
    ends: Mapping[str, float] | None = None,
    now: float = 0.0,
) -> str | None:
    """The node to nominate for `request`: of the schedulable nodes where it fits when empty
    and that no other nomination holds, the one expected to drain first; None when there is
    none. Where the time limits of the node's jobs bound when it fits (`ends`: job id ->
    wall-clock end; `expected_start`), that bound is the expected start, and such nodes
    come first, earliest first. Otherwise, without runtime estimates, every running job is taken
    to have the same remaining work, so a node waits for the last of its k jobs (H(k) = 1 + 1/2
    + ... + 1/k times one job's, as for memoryless runtimes) at its GPU speed (`gpu_speed`:
    slower cards run the same work longer): the lowest H(k) / speed wins. Then the most wholly
    free cards, the most free GPU compute, the earliest. Fewer jobs to wait for also means
    fewer cards left idle."""
    rows = filter_when_empty(snapshot, request).nodes
    rows = rows[[snapshot.nodes[int(i)].name not in taken for i in rows]] if taken else rows
    if len(rows) == 0:
        return None
    placed = [snapshot.placements_on(snapshot.nodes[int(i)].name) for i in rows]
    jobs = np.array([len(p) for p in placed])
    harmonic = np.cumsum(np.concatenate(([0.0], 1.0 / np.arange(1, int(jobs.max()) + 1))))
    drain = harmonic[jobs] / snapshot.gpu_speed[rows]
    unknown = np.ones(len(rows), dtype=bool)
    if ends:
        for k, i in enumerate(rows):
            start = expected_start(snapshot, int(i), request, placed[k], ends, now)
            if start is not None:
                unknown[k], drain[k] = False, start
    order = np.lexsort(
        (rows, -snapshot.gpu_milli_free[rows], -snapshot.full_free[rows], drain, unknown)
    )
    return snapshot.nodes[int(rows[order[0]])].name
