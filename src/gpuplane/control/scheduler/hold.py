"""Node holds: what a reservation keeps from other jobs while the node drains for its job.

A job that has waited too long (the service's admission decides when) is given one node; every
other request is then filtered against that node's free resources minus what the held job needs,
so nothing new lands on what it waits for and the node drains as its jobs end. No runtime
estimates are needed (Volcano's reservation and Slurm's drain work the same way). Pure: a hold is
a mask over the filter's view (`held_state`), the snapshot itself never changes.

What a hold of request r on node i takes from the others:
- CPU and memory: r's, off the node's free CPU and memory;
- whole cards (k): k of the node's wholly free cards; while fewer than k are free, every card of
  the node (any of them may be the next to empty), and when exactly k are free, those;
- a share: the card with the most free memory (then compute), the one closest to fitting it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuplane.control.scheduler.decision import Request
from gpuplane.control.scheduler.explain import State, free_state
from gpuplane.control.scheduler.snapshot import MILLI_PER_GPU, BoolArray, Snapshot


@dataclass(frozen=True, slots=True)
class Hold:
    """Node `node` (a node name) is held for `request` (its job id says for whom)."""

    node: str
    request: Request


def held_state(snapshot: Snapshot, holds: Sequence[Hold]) -> State:
    """The free resources others may use: `free_state` with every hold taken off its node."""
    if not holds:
        return free_state(snapshot)
    cpu = snapshot.cpu_free.copy()
    mem = snapshot.mem_free.copy()
    full = snapshot.full_free.copy()
    milli = snapshot.dev_milli_free.copy()
    dev_mem = snapshot.dev_mem_free.copy()
    rows = [snapshot.index[h.node] for h in holds]
    for i, hold in zip(rows, holds, strict=True):
        r = hold.request
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
    """Which cards of node row `i` the hold of `r` keeps from every other request, and how many
    of the wholly free cards left it keeps besides (any k of them will do)."""
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
