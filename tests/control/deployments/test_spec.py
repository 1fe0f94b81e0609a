"""Deployment specs: validated, every field honoured or refused with the reason."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplane.control.deployments.spec import parse_deployment, split_by_weight
from gpuplane.control.spec import SpecError, parse_spec

BASE: dict[str, Any] = {"name": "chat", "model": "sim", "engine": "sim", "team": "research"}


def test_an_unknown_field_names_the_nearest_valid_one() -> None:
    with pytest.raises(SpecError) as caught:
        parse_deployment({**BASE, "replica": 2})
    assert "unknown field 'replica' (did you mean 'replicas'?)" in str(caught.value)


def test_an_unknown_engine_lists_the_valid_ones() -> None:
    with pytest.raises(SpecError) as caught:
        parse_deployment({**BASE, "engine": "vlm"})
    assert "engine" in str(caught.value)
    assert "'vllm'" in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {
                "scaling": {"min": 1, "max": 3},
                "canary": [{"version": "v2", "weight": 10, "replicas": 2}],
            },
            "canary v2: `replicas` with `scaling`: the autoscaler sizes every version by its "
            "weight",
        ),
    ],
)
def test_fields_not_acted_on_yet_are_refused_with_the_reason(
    fields: dict[str, Any], reason: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_deployment({**BASE, **fields})
    assert reason in str(caught.value)


def test_a_deployment_that_scales_to_zero_starts_at_zero_and_holds_requests() -> None:
    spec = parse_deployment({**BASE, "scaling": {"min": 0, "max": 3, "max_queue_wait_s": 20}})
    assert spec.desired == 0
    assert spec.hold_s == 20.0  # the gateway holds a request this long while none is ready
    # an autoscaled one holds as long whenever none is ready; a fixed one for the gateway's
    # own queue timeout (None)
    assert parse_deployment({**BASE, "scaling": {"min": 1, "max": 3}}).hold_s == 5.0
    assert parse_deployment(BASE).hold_s is None


def test_replicas_and_scaling_exclude_each_other() -> None:
    with pytest.raises(SpecError, match="replicas or scaling, not both"):
        parse_deployment({**BASE, "replicas": 2, "scaling": {"min": 1, "max": 2}})


def test_a_bad_slice_is_refused_as_the_job_would_be() -> None:
    with pytest.raises(SpecError, match="fractional slice"):
        parse_deployment({**BASE, "slice": {"gpus": 2, "gpu_mem_mib": 1024}})


def test_no_team_takes_the_default_or_is_refused() -> None:
    data = {k: v for k, v in BASE.items() if k != "team"}
    assert parse_deployment(data, "ml").team == "ml"
    with pytest.raises(SpecError, match="team"):
        parse_deployment(data)


def test_an_instance_is_a_job_running_the_engine_on_its_slice() -> None:
    spec = parse_deployment(
        {
            **BASE,
            "version": "v2",
            "max_concurrency": 8,
            "engine_args": ["--itl-ms", "5"],
            "slice": {"gpu_mem_mib": 8192, "gpu_cores_pct": 25},
            "placement": {"gpu_models": ["A100-80GB"], "region": "eu"},
        }
    )
    job = spec.to_job("127.0.0.1", 9001)
    assert job["name"] == "chat-v2"
    assert job["command"][:3] == [sys.executable, "-m", "gpuplane.cli.main"]
    assert job["command"][3:5] == ["engine", "sim"]
    argv = " ".join(job["command"])
    assert "--base-port 9001" in argv
    assert "--max-num-seqs 8" in argv
    assert argv.endswith("--itl-ms 5")
    assert job["resources"] == {
        "gpus": 0,
        "gpu_mem_mib": 8192,
        "gpu_cores_pct": 25,
        "cpu_millis": 0,
        "memory_mib": 0,
    }
    parsed = parse_spec(job)
    assert parsed.to_selector().gpu_models == frozenset({"A100-80GB"})
    # `serve` marks it an instance: its port, and its version's spec for an adapter that runs
    # instances its own way (Kubernetes: a KServe InferenceService)
    assert parsed.serve is not None
    assert parsed.serve.port == 9001
    assert parse_deployment(parsed.serve.deployment) == spec


def test_a_bad_serve_field_is_refused_like_the_rest_of_the_job_spec() -> None:
    job = parse_deployment(BASE).to_job("127.0.0.1", 9001)
    cases = [
        ({"port": 0, "deployment": job["serve"]["deployment"]}, "serve.port"),
        ({"prot": 1}, "unknown field 'serve.prot' (did you mean 'port'?)"),
    ]
    for serve, message in cases:
        with pytest.raises(SpecError, match=re.escape(message)):
            parse_spec({**job, "serve": serve})


def test_without_max_concurrency_the_engine_keeps_its_own_limit_and_reports_it() -> None:
    spec = parse_deployment(BASE)
    assert spec.discovers_capacity
    assert "--max-num-seqs" not in spec.to_job("h", 1)["command"]  # the engine's own limit
    assert spec.capacity() == 4  # what the autoscaler assumes until an instance reports
    fixed = parse_deployment({**BASE, "max_concurrency": 6})
    assert not fixed.discovers_capacity
    assert "--max-num-seqs 6" in " ".join(fixed.to_job("h", 1)["command"])


def test_scaling_starts_from_min_and_min_may_not_exceed_max() -> None:
    spec = parse_deployment({**BASE, "scaling": {"min": 2, "max": 4, "target_slot_util": 0.5}})
    assert spec.desired == 2
    rules = spec.rules()
    assert rules is not None
    assert (rules.min, rules.max, rules.target_slot_util, rules.slots_per_instance) == (
        2,
        4,
        0.5,
        4,
    )
    with pytest.raises(SpecError, match=r"min \(3\) must not exceed max \(2\)"):
        parse_deployment({**BASE, "scaling": {"min": 3, "max": 2}})


def test_autoscaled_versions_share_the_replicas_by_weight() -> None:
    spec = parse_deployment(
        {**BASE, "scaling": {"min": 0, "max": 10}, "canary": [{"version": "v2", "weight": 10}]}
    )
    assert [spec.replicas_by_version(n) for n in (0, 1, 2, 3, 10)] == [
        {"v1": 0, "v2": 0},
        {"v1": 1, "v2": 0},  # one instance: the heaviest version
        {"v1": 1, "v2": 1},  # from two on, every version with a weight runs one
        {"v1": 2, "v2": 1},
        {"v1": 9, "v2": 1},
    ]
    fixed = parse_deployment({**BASE, "replicas": 3, "canary": [{"version": "v2", "weight": 10}]})
    assert fixed.replicas_by_version(3) == {"v1": 3, "v2": 1}  # a canary's own, default 1


@pytest.mark.parametrize("total", range(0, 21))
def test_split_by_weight_hands_out_every_instance(total: int) -> None:
    for weights in (
        {"a": 50.0, "b": 50.0},
        {"a": 80.0, "b": 15.0, "c": 5.0},
        {"a": 0.0, "b": 100.0},
    ):
        split = split_by_weight(total, weights)
        assert sum(split.values()) == total
        assert all(abs(split[v] - total * w / 100) < 1 + len(weights) for v, w in weights.items())
        assert (
            split[min(weights, key=lambda v: weights[v])]
            <= split[max(weights, key=lambda v: weights[v])]
        )


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[3] / "examples" / "deploy").glob("*.yaml")), ids=str
)
def test_every_example_spec_is_valid(path: Path) -> None:
    spec = parse_deployment(yaml.safe_load(path.read_text()))
    assert spec.name
