"""Post-filter: why a request does not fit, one typed reason (code and numbers) per cluster.

Runs only when the filter left no candidate, so it may look at every card of every cluster.
The checks go from coarse to fine and stop at the first that leaves no node, so the code names the
constraint that actually blocks: labels, then capacity (never fits), then GPU, CPU and memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import numpy as np

from gpuplane.control.scheduler.decision import (
    MILLI_PER_GPU,
    BoolArray,
    ClusterReason,
    ReasonCode,
    Request,
)
from gpuplane.control.scheduler.filter import State, capacity_state, filter_nodes, free_state
from gpuplane.control.scheduler.nomination import Nomination
from gpuplane.control.scheduler.snapshot import Snapshot


def explain(s: Snapshot, r: Request, capacity: bool = False) -> tuple[ClusterReason, ...]:
    """One `ClusterReason` per cluster where `r` does not fit (against capacity if asked)."""
    state = capacity_state(s) if capacity else free_state(s)
    static = _fits_static(s, r)  # computed once for every node, then masked per cluster
    gpu = _gpu_fits(s, r, state) if r.is_gpu else static
    out = []
    for c, cluster in enumerate(s.clusters):
        reason = _cluster_reason(s, r, cluster, s.cluster_masks[c], state, static, gpu)
        if reason is not None:
            out.append(reason)
    return tuple(out)


def why_not(
    snapshot: Snapshot, request: Request, nominations: Sequence[Nomination]
) -> tuple[ClusterReason, ...]:
    """`explain`'s reasons, except in clusters where the request would fit but for
    `nominations`: there the code is `BlockedByNomination`, naming the nodes and their jobs."""
    reasons = explain(snapshot, request)
    if not nominations:
        return reasons
    free = filter_nodes(snapshot, request, free_state(snapshot))
    if len(free) == 0:
        return reasons
    held = {n.node: n for n in nominations}
    blocked: dict[str, list[str]] = {}
    timed: set[str] = set()  # clusters where a nomination has an expected start
    for row in free.nodes:
        node = snapshot.nodes[int(row)]
        nomination = held[node.name]
        blocked.setdefault(node.cluster, []).append(
            f"{node.name} (job {nomination.request.job_id})"
        )
        if nomination.start_s is not None:
            timed.add(node.cluster)
    backfill = (
        "; only jobs whose time limits end before the held jobs' expected starts may use "
        "them meanwhile"
    )
    out = [r for r in reasons if r.cluster not in blocked]
    out += [
        ClusterReason(
            cluster,
            ReasonCode.BLOCKED_BY_NOMINATION,
            "fits only on nodes held for jobs that waited longer: "
            + ", ".join(nodes)
            + (backfill if cluster in timed else ""),
            MappingProxyType({"held_nodes": len(nodes)}),
        )
        for cluster, nodes in blocked.items()
    ]
    return tuple(out)


def _reason(cluster: str, code: ReasonCode, msg: str, **numbers: int) -> ClusterReason:
    return ClusterReason(cluster, code, msg, MappingProxyType(numbers))


def _cluster_reason(
    s: Snapshot,
    r: Request,
    cluster: str,
    mask: BoolArray,
    st: State,
    static: BoolArray,
    gpu: BoolArray,
) -> ClusterReason | None:
    nodes = mask & s.schedulable
    if not nodes.any():
        return _reason(cluster, ReasonCode.NO_NODES, "no schedulable node")
    sel = nodes & s.selector_mask(r.selector)
    if not sel.any():
        want = dict(r.selector.match_labels)
        models = sorted(r.selector.gpu_models)
        return _reason(
            cluster,
            ReasonCode.NO_MATCHING_NODE,
            f"no node matches labels {want} and GPU models {models or 'any'}",
            nodes=int(nodes.sum()),
        )
    if r.is_fractional:
        sel &= s.splittable
        if not sel.any():
            return _reason(
                cluster,
                ReasonCode.NOT_SPLITTABLE,
                "a fractional request, but no matching node shares its cards (vGPU)",
            )
    if not (sel & static).any():
        return _capacity_reason(s, r, cluster, sel)
    sel &= static
    gpu_ok = sel & gpu
    if not gpu_ok.any():
        return _gpu_reason(s, r, cluster, sel, st)
    cpu_ok = gpu_ok & (st.cpu >= r.cpu_millis)
    if not cpu_ok.any():
        return _reason(
            cluster,
            ReasonCode.INSUFFICIENT_CPU,
            f"no node with room for the GPU request has {r.cpu_millis} free CPU millis",
            requested=r.cpu_millis,
            max_free=int(st.cpu[gpu_ok].max()),
        )
    mem_ok = cpu_ok & (st.mem >= r.memory_mib)
    if not mem_ok.any():
        return _reason(
            cluster,
            ReasonCode.INSUFFICIENT_MEMORY,
            f"no node with room for the GPU and CPU request has {r.memory_mib} MiB free memory",
            requested=r.memory_mib,
            max_free=int(st.mem[cpu_ok].max()),
        )
    return None


def _fits_static(s: Snapshot, r: Request) -> BoolArray:
    """Nodes whose *capacity* could host `r` (CPU, memory and cards), nothing running."""
    ok = (s.cpu_cap >= r.cpu_millis) & (s.mem_cap >= r.memory_mib)
    if r.gpus:
        ok &= s.n_devices >= r.gpus
    elif r.is_fractional:
        ok &= (s.dev_exists & (s.dev_mem_cap >= r.mem_on(s.dev_mem_cap))).any(axis=1)
    return ok


def _capacity_reason(s: Snapshot, r: Request, cluster: str, sel: BoolArray) -> ClusterReason | None:
    if (sel & _fits_static(s, r)).any():
        return None
    code = ReasonCode.EXCEEDS_CAPACITY
    if r.gpus and not (s.n_devices[sel] >= r.gpus).any():
        return _reason(
            cluster,
            code,
            f"{r.gpus} GPUs requested; no matching node has that many",
            requested=r.gpus,
            max_per_node=int(s.n_devices[sel].max()),
        )
    if r.is_fractional:
        need = r.gpu_mem_mib or 0  # a fixed amount on every card; a share of a card fits any
        if need and not (s.max_card_mem[sel] >= need).any():
            return _reason(
                cluster,
                code,
                f"{need} MiB GPU memory requested; the largest matching "
                f"card has {int(s.max_card_mem[sel].max())} MiB",
                requested=need,
                max_card=int(s.max_card_mem[sel].max()),
            )
    if not (s.cpu_cap[sel] >= r.cpu_millis).any():
        return _reason(
            cluster,
            code,
            f"{r.cpu_millis} CPU millis requested; no matching node has that many",
            requested=r.cpu_millis,
            max_node=int(s.cpu_cap[sel].max()),
        )
    return _reason(
        cluster,
        code,
        f"{r.memory_mib} MiB memory requested; no matching node has "
        "that much (with its CPU and cards)",
        requested=r.memory_mib,
        max_node=int(s.mem_cap[sel].max()),
    )


def _gpu_fits(s: Snapshot, r: Request, st: State) -> BoolArray:
    if r.gpus:
        ok: BoolArray = st.full_free >= r.gpus
        return ok
    fit = s.dev_exists & (st.dev_milli >= r.gpu_milli) & (st.dev_mem >= r.mem_on(s.dev_mem_cap))
    return np.asarray(fit.any(axis=1), dtype=bool)


def _gpu_reason(s: Snapshot, r: Request, cluster: str, sel: BoolArray, st: State) -> ClusterReason:
    if r.gpus:
        total_full = int(st.full_free[sel].sum())
        total_milli = int(st.dev_milli[sel].sum())
        numbers = dict(
            requested=r.gpus,
            max_free_on_a_node=int(st.full_free[sel].max()),
            free_cards=total_full,
            free_milli=total_milli,
        )
        if total_full >= r.gpus:
            return _reason(
                cluster,
                ReasonCode.FRAGMENTED,
                f"{total_full} wholly free cards in total, but no node has {r.gpus} of them",
                **numbers,
            )
        if total_milli >= r.gpus * MILLI_PER_GPU:
            return _reason(
                cluster,
                ReasonCode.FRAGMENTED,
                f"{total_milli / 1000:.2f} GPUs free in total, but spread over partly used cards",
                **numbers,
            )
        return _reason(
            cluster,
            ReasonCode.INSUFFICIENT_GPUS,
            f"{r.gpus} whole GPUs requested, {total_full} free",
            **numbers,
        )
    exists = s.dev_exists & sel[:, None]
    need = r.mem_on(s.dev_mem_cap)
    mem_ok = exists & (st.dev_mem >= need)
    milli_ok = exists & (st.dev_milli >= r.gpu_milli)
    free_mem, free_milli = st.dev_mem[exists], st.dev_milli[exists]
    numbers = dict(
        requested_mem_mib=int(need[exists].min()),
        requested_milli=r.gpu_milli,
        max_free_mem_mib=int(free_mem.max()),
        max_free_milli=int(free_milli.max()),
        free_mem_mib=int(free_mem.sum()),
        free_milli=int(free_milli.sum()),
    )
    if not mem_ok.any() and numbers["free_mem_mib"] < numbers["requested_mem_mib"]:
        return _reason(
            cluster,
            ReasonCode.INSUFFICIENT_GPU_MEMORY,
            f"no card has {numbers['requested_mem_mib']} MiB free GPU memory",
            **numbers,
        )
    if not milli_ok.any() and numbers["free_milli"] < r.gpu_milli:
        return _reason(
            cluster,
            ReasonCode.INSUFFICIENT_GPU_CORES,
            f"no card has {r.gpu_milli / 10:g}% free compute",
            **numbers,
        )
    if not mem_ok.any():
        return _reason(
            cluster,
            ReasonCode.FRAGMENTED,
            "enough free GPU memory in total, but no "
            f"card has {numbers['requested_mem_mib']} MiB of it",
            **numbers,
        )
    return _reason(
        cluster,
        ReasonCode.FRAGMENTED,
        "enough free GPU memory and compute in total, but no single card has all that is requested",
        **numbers,
    )
