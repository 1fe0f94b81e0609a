"""The seed-like fleet: seeded, shaped like the seed's estate, labelled, in the sample schema."""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc

from gpuplane.audit.fleet import FleetSpec, generate
from gpuplane.audit.samples import validate


def test_the_same_seed_gives_the_same_fleet_and_another_seed_another() -> None:
    spec = FleetSpec(days=0.5)
    a, b, c = generate(7, spec), generate(7, spec), generate(8, spec)
    assert a.workloads == b.workloads
    assert a.samples().equals(b.samples())
    assert a.traffic().equals(b.traffic())
    assert a.workloads != c.workloads


def test_it_is_the_seed_estate_in_the_audit_schema() -> None:
    fleet = generate(0, FleetSpec(days=1))
    assert sum(len(n.devices) for n in fleet.nodes) == 260
    assert {n.labels["gpuplane.io/gpu-model"] for n in fleet.nodes} == {"A100-80GB"}
    assert 15 <= len({w.team for w in fleet.workloads}) <= 20
    samples = fleet.samples()
    validate(samples)
    validate(fleet.traffic())
    inference = [w for w in fleet.workloads if w.kind == "inference"]
    needs = [w.weights_mib + w.kv_mib for w in inference]
    assert sum(n < 10 * 1024 for n in needs) / len(needs) > 0.5  # most need under 10 GiB
    assert any(n > 50 * 1024 for n in needs)  # a few heavy ones
    assert any(w.rps == 0 for w in inference)  # cards held with no traffic
    # one row per workload and free card per minute
    assert samples.num_rows == (len(fleet.workloads) + len(fleet.free_cards)) * len(fleet.times)
    assert pc.max(samples["compute_share"]).as_py() <= 1.0


def test_ground_truth_labels_every_class() -> None:
    fleet = generate(0, FleetSpec(days=0.5))
    truth = fleet.truth()
    classes = Counter(c for labels in truth.values() for c in labels)
    assert set(classes) == {"idle", "idle_held", "oversized_memory", "oversized_compute",
                            "zero_traffic", "fragmented"}  # fmt: skip
    dead = [w.name for w in fleet.workloads if w.profile == "dead"]
    assert all({"idle_held", "zero_traffic"} <= truth[w] for w in dead)
    heavy = [w.name for w in fleet.workloads if w.profile == "heavy"]
    assert all("oversized_compute" not in truth[w] for w in heavy)
