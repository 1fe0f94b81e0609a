"""Each policy on hand-made snapshots: where it puts a job, and why that is its contract."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplane.control.scheduler import (
    Request,
    Snapshot,
    TaskClass,
    WorkloadMix,
    make_policy,
    schedule,
)
from tests.control.scheduler.sched_helpers import GIB, decide, node, node_of


def half_used() -> Snapshot:
    """n1: 8 cards, 6 taken whole; n2: 8 free cards."""
    snap = Snapshot([node("n1"), node("n2")])
    snap.commit(decide(snap, Request("big", gpus=6), "best-fit").placement)  # type: ignore[arg-type]
    assert snap.allocations["big"].node == "n1"
    return snap


@pytest.mark.parametrize("policy", ["best-fit", "binpack", "packing", "frag", "fgd"])
def test_consolidating_policies_fill_the_used_node(policy: str) -> None:
    assert node_of(half_used(), Request("j", gpus=1), policy) == "n1"


def test_spread_picks_the_emptiest_node_and_the_freest_card() -> None:
    snap = half_used()
    assert node_of(snap, Request("j", gpus=1), "spread") == "n2"
    snap = Snapshot([node("n1", cards=2)])
    first = decide(snap, Request("a", gpu_milli=300), "spread").placement
    assert first is not None
    snap.commit(first)
    second = decide(snap, Request("b", gpu_milli=300), "spread").placement
    assert second is not None
    assert second.devices[0].index != first.devices[0].index


def test_best_fit_and_packing_share_the_fullest_card_that_fits() -> None:
    snap = Snapshot([node("n1", cards=3)])
    for job, milli in (("a", 300), ("b", 600)):
        placement = decide(snap, Request(job, gpu_milli=milli), "spread").placement
        assert placement is not None
        snap.commit(placement)
    # cards now: 700, 400 and 1000 free (spread used different cards)
    free = sorted(snap.dev_milli_free[0].tolist())
    assert free == [400, 700, 1000]
    for policy in ("best-fit", "packing", "binpack"):
        placement = decide(snap, Request("c", gpu_milli=350), policy).placement
        assert placement is not None
        assert snap.dev_milli_free[0, placement.devices[0].index] == 400


def test_packing_prefers_a_shared_card_then_a_used_node_then_an_empty_one() -> None:
    snap = Snapshot([node("n1", cards=2), node("n2", cards=2), node("n3", cards=2)])
    snap.commit(decide(snap, Request("s", gpu_milli=500), "packing").placement)  # type: ignore[arg-type]
    used = snap.allocations["s"].node
    # a share fits on the half-used card
    assert node_of(snap, Request("t", gpu_milli=400), "packing") == used
    # a whole card goes to the used node's free card rather than an empty node
    assert node_of(snap, Request("w", gpus=1), "packing") == used


def test_random_spreads_over_every_fitting_node() -> None:
    snap = Snapshot([node(f"n{i}", cards=1) for i in range(4)])
    seen = {node_of(snap, Request("j", gpus=1), "random", seed) for seed in range(40)}
    assert seen == {"n0", "n1", "n2", "n3"}


def fragmentation_case() -> Snapshot:
    """n1: one card with 600 milli free; n2: one free card."""
    snap = Snapshot([node("n1", cards=1), node("n2", cards=1)])
    snap.commit(decide(snap, Request("x", gpu_milli=400), "best-fit").placement)  # type: ignore[arg-type]
    assert snap.allocations["x"].node == "n1"
    return snap


def halves() -> WorkloadMix:
    return WorkloadMix([TaskClass(gpus=0, milli=500, cpu_millis=0, memory_mib=0, weight=1.0)])


def test_fragmentation_aware_policies_keep_fragments_usable() -> None:
    """A 400-milli job on n1 would leave 200 milli no 500-milli task can use; on n2 it leaves 600.

    Best fit takes n1 (least left); FGD and frag take n2, where nothing becomes a fragment.
    """
    req = Request("j", gpu_milli=400)
    assert node_of(fragmentation_case(), req, "best-fit") == "n1"
    assert node_of(fragmentation_case(), req, make_policy("fgd", mix=halves())) == "n2"
    assert node_of(fragmentation_case(), req, make_policy("frag", mix=halves())) == "n2"


def test_frag_learns_the_mix_from_the_requests_it_sees() -> None:
    policy = make_policy("frag")
    warmup = Snapshot([node("w", cards=1)])
    for i in range(20):
        schedule(warmup, Request(f"h{i}", gpu_milli=500), policy, np.random.default_rng(0))
    assert node_of(fragmentation_case(), Request("j", gpu_milli=400), policy) == "n2"


def test_frag_counts_host_memory_that_fgd_ignores() -> None:
    """Typical tasks need 4 GiB of host memory. n1 has 5 GiB left: a 2 GiB job there strands its
    GPU for them. FGD sees only CPU and ties (first node wins); frag goes to n2."""
    classes = [TaskClass(0, 250, 0, 4 * GIB, 1.0)]
    snap = Snapshot([node("n1", cards=1, mem_gib=16), node("n2", cards=1, mem_gib=16)])
    snap.commit(decide(snap, Request("mem", memory_mib=11 * GIB), "best-fit").placement)  # type: ignore[arg-type]
    assert snap.allocations["mem"].node == "n1"
    req = Request("j", gpu_milli=250, memory_mib=2 * GIB)
    assert node_of(snap, req, make_policy("fgd", mix=WorkloadMix(classes))) == "n1"
    assert (
        node_of(snap, req, make_policy("frag", mix=WorkloadMix(classes, use_memory=True))) == "n2"
    )


@pytest.mark.parametrize("policy", ["frag", "fgd", "random", "best-fit"])
def test_decisions_are_reproducible_with_the_same_rng(policy: str) -> None:
    def run(seed: int) -> list[str]:
        snap = Snapshot([node(f"n{i}", cards=2) for i in range(6)])
        pol = make_policy(policy)
        rng = np.random.default_rng(seed)
        out = []
        for i in range(12):
            d = schedule(snap, Request(f"j{i}", gpu_milli=300 + 50 * (i % 5)), pol, rng)
            assert d.placement is not None
            snap.commit(d.placement)
            out.append(f"{d.placement.node}/{d.placement.devices[0].index}")
        return out

    assert run(7) == run(7)


@pytest.mark.parametrize("policy", ["frag", "fgd"])
def test_with_no_gpu_task_known_a_share_still_lands_on_a_card_that_fits(policy: str) -> None:
    snap = Snapshot([node("n1", cards=2)])
    snap.commit(decide(snap, Request("whole", gpus=1), "best-fit").placement)  # type: ignore[arg-type]
    taken = snap.allocations["whole"].devices[0].index
    pol = make_policy(policy, mix=WorkloadMix([]))
    placement = decide(snap, Request("share", gpu_milli=10), pol).placement
    assert placement is not None
    assert placement.devices[0].index != taken


def cpu_used() -> Snapshot:
    """n1 and n2: 8 free cards each; n2 has 20 cores, n1 64."""
    return Snapshot([node("n1"), node("n2", cpu=20_000)])


def test_frag_packs_a_cpu_only_job_where_it_fits_best_and_leaves_gpu_ties_to_fgd() -> None:
    """With the mix's tasks needing 8 cores, a 4-core job strands no GPU on either node: FGD's
    scores tie. A CPU-only job goes where it fits best (n2, with fewer cores), which
    keeps n1's cores for the GPU tasks; a GPU job ties as in FGD (the first node: consolidating
    the cards matters more there than the cores left, measured over the mixes)."""
    mix = WorkloadMix([TaskClass(1, 1000, 8000, 0, 1.0)], use_memory=True)
    cpu_job, gpu_job = Request("c", cpu_millis=4000), Request("g", gpus=1, cpu_millis=4000)
    assert node_of(cpu_used(), cpu_job, make_policy("fgd", mix=mix)) == "n1"
    assert node_of(cpu_used(), cpu_job, make_policy("frag", mix=mix)) == "n2"
    assert node_of(cpu_used(), gpu_job, make_policy("fgd", mix=mix)) == "n1"
    assert node_of(cpu_used(), gpu_job, make_policy("frag", mix=mix)) == "n1"


def test_fgd_learns_its_classes_as_the_published_simulator_does() -> None:
    """Its typical pods: CPU, GPU share, cards and model (not host memory), the popular ones
    covering 95 %, weights renormalised over those kept."""
    pods = [Request(f"a{i}", gpu_milli=500, memory_mib=GIB * (i % 4 + 1)) for i in range(60)]
    pods += [Request(f"b{i}", gpus=2, memory_mib=GIB * i) for i in range(40)]
    mix = make_policy("fgd").for_mix(pods).mix  # type: ignore[attr-defined]
    assert sorted((c.gpus, c.milli, c.weight) for c in mix.classes) == [
        (0, 500, pytest.approx(0.6)),
        (2, 1000, pytest.approx(0.4)),
    ]
