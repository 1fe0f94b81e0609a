"""The fragmentation policies' cache of dV gives exactly what the straightforward path computes.

`DeltaCache` keeps dV per node and request class, and the request-independent terms per node,
and recomputes only rows whose `node_version` moved. A stale entry would change decisions
silently, so a seeded stream with commits, releases, selectors, online mix rebuilds and a
what-if copy is scored both ways and every dV must be bit-identical.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import replace

import numpy as np
import pytest

from gpuplane.control.scheduler import Request, Snapshot, make_policy, schedule
from gpuplane.control.scheduler.base import Candidates
from gpuplane.control.scheduler.decision import FloatArray
from gpuplane.control.scheduler.fragmentation import WorkloadMix
from gpuplane.control.scheduler.policies.fgd import FragmentationPolicy
from gpuplane.resources import Selector
from tests.control.scheduler.sched_helpers import GIB, node


def _snapshot() -> Snapshot:
    nodes = [node(f"a{i}", cards=4, model="A100", cpu=32_000, mem_gib=256) for i in range(6)]
    nodes += [node(f"l{i}", cards=4, card_gib=48, model="L40S", region="us") for i in range(6)]
    return Snapshot(nodes)


def _stream(n: int, rng: np.random.Generator) -> list[Request]:
    jobs = []
    for i in range(n):
        cpu = int(rng.choice([2, 4, 8])) * 1000
        mem = int(rng.choice([8, 32])) * GIB
        kind = int(rng.integers(4))
        if kind == 0:
            pct = int(rng.choice([10, 25, 50]))
            req = Request(f"j{i}", gpu_milli=pct * 10, gpu_mem_mib=pct * 400, cpu_millis=cpu)
        elif kind == 1:
            req = Request(f"j{i}", gpu_milli=int(rng.choice([300, 600])), cpu_millis=cpu)
        elif kind == 2:
            req = Request(f"j{i}", gpus=int(rng.choice([1, 2])), cpu_millis=cpu, memory_mib=mem)
        else:
            req = Request(f"j{i}", cpu_millis=cpu, memory_mib=mem)
        if rng.random() < 0.3:
            req = replace(req, selector=Selector(gpu_models=frozenset({"L40S"})))
        jobs.append(req)
    return jobs


@pytest.mark.parametrize("policy", ["frag", "fgd"])
def test_cached_dv_is_bit_identical_to_the_straightforward_path(policy: str) -> None:
    checked = 0
    mixes: list[tuple[object, tuple[object, ...]]] = []  # each mix scored with, and its layout

    class Checked:
        """Wraps the policy's cache: each dV it returns is compared to `WorkloadMix.delta`."""

        def __init__(self, pol: FragmentationPolicy) -> None:
            self.pol, self.cached = pol, pol.delta

        def __call__(self, cands: Candidates) -> FloatArray:
            nonlocal checked
            got = self.cached(cands)
            mix = self.pol.mix
            if not mixes or mixes[-1][0] is not mix:
                mixes.append((mix, mix.layout))
            np.testing.assert_array_equal(got, self.pol.mix.delta(cands))
            checked += 1
            return got

    pol = make_policy(policy)
    assert isinstance(pol, FragmentationPolicy)
    pol.delta = Checked(pol)  # type: ignore[method-assign]
    snap, rng = _snapshot(), np.random.default_rng(3)
    ends: list[tuple[float, str]] = []
    placed = 0
    for i, job in enumerate(_stream(400, np.random.default_rng(11))):
        while ends and ends[0][0] <= i:
            snap.release(heapq.heappop(ends)[1])
        if i % 50 == 25:  # a what-if on a copy, then back to the live snapshot
            trial = snap.copy()
            d = schedule(trial, job, pol, rng)
            if d.placement is not None:
                trial.commit(d.placement)
        d = schedule(snap, job, pol, rng)
        if d.placement is not None:
            snap.commit(d.placement)
            placed += 1
            heapq.heappush(ends, (i + rng.exponential(150), job.job_id))
    assert checked > 300
    # the online mix was rebuilt with new weights only (the kept terms weighed again) and with
    # new classes (the cache emptied)
    same_layout = [a[1] == b[1] for a, b in itertools.pairwise(mixes)]
    assert True in same_layout
    assert False in same_layout
    assert 100 < placed < 400  # the estate fills: full nodes and refusals are exercised


def test_a_mix_keeps_its_layout_when_only_the_popularity_order_changes() -> None:
    """The online mix is rebuilt as counts grow; when the same classes swap places in the
    popularity order, only the weights change, so the cache may weigh its terms again."""
    a100 = Selector(gpu_models=frozenset({"A100"}))
    l40s = Selector(gpu_models=frozenset({"L40S"}))

    def reqs(first: Selector, second: Selector) -> list[Request]:
        out = [Request(f"a{i}", gpu_milli=500, selector=first) for i in range(6)]
        return out + [Request(f"b{i}", gpus=1, cpu_millis=4000, selector=second) for i in range(3)]

    one = WorkloadMix.from_requests(reqs(a100, l40s))
    other = WorkloadMix.from_requests(reqs(l40s, a100))
    assert one.layout == other.layout
    assert one.selectors == other.selectors
    assert WorkloadMix.from_requests(reqs(a100, a100)).layout != one.layout
