"""The kubernetes adapter's pure parts: every manifest it can emit is valid against the OpenAPI
schema of each Kubernetes version it supports (`kubernetes-validate`'s bundled schemas), the
per-version choice matters, HAMi's node annotation in both its forms, version parsing and the
names and labels it derives from job ids."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from pydantic import ValidationError

from gpuplane.control.adapters import AdapterError, Workload
from gpuplane.control.adapters.k8s import manifests
from gpuplane.control.adapters.k8s.hami import HamiCard, parse_register
from gpuplane.control.adapters.k8s.versions import SUPPORTED, ApiProfile, api_profile, parse_minor
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig
from tests.control.k8s_fake import encode_register, hami_card

MINORS = list(range(SUPPORTED[0], SUPPORTED[1] + 1))
WORKLOADS = {
    "fractional": Workload(
        job_id="train-7f3a",
        name="train",
        command=("python", "train.py", "--epochs", "3"),
        node="gpu-a",
        devices=(DeviceGrant(0, 10240, 300),),
        env={"WANDB_MODE": "offline"},
        workdir="/work",
        cpu_millis=4000,
        memory_mib=16384,
        fractional=True,
        time_limit_s=3600.5,
        team="ml-research",
    ),
    "whole cards, no limits": Workload(
        job_id="Eval_Run.42",
        name="eval",
        command=("sh", "-c", "true"),
        node="gpu-b",
        devices=(DeviceGrant(0, 81920, 1000), DeviceGrant(1, 81920, 1000)),
        team=None,
    ),
    "no GPU": Workload(job_id="cpu-only", name="c", command=("true",), node="cpu-1"),
}
CLUSTER = ClusterConfig(name="k", adapter="kubernetes")


def emitted(minor: int) -> list[dict[str, Any]]:
    """Every manifest the adapter emits on a server of `minor`: Pod and Job, each workload."""
    profile = ApiProfile(minor, f"v1.{minor}.0", frozenset({"v1", "batch/v1"}))
    out = []
    for workload in WORKLOADS.values():
        binding = manifests.Binding(
            manifests.namespace_of(CLUSTER, workload.team),
            manifests.object_name(workload.job_id),
            tuple(f"GPU-{d.index}" for d in workload.devices),
        )
        out.append(manifests.pod_manifest(workload, binding, CLUSTER, "host:8080"))
        out.append(manifests.job_manifest(workload, binding, CLUSTER, "host:8080", profile))
    return out


def test_the_bundled_schemas_cover_the_supported_range() -> None:
    available = set(kubernetes_validate.utils.all_versions())
    assert {f"1.{m}.0" for m in MINORS} <= available


@pytest.mark.parametrize("minor", MINORS)
def test_every_manifest_is_valid_for_its_version(minor: int) -> None:
    for manifest in emitted(minor):
        kubernetes_validate.validate(manifest, f"1.{minor}", strict=True)


def test_the_fields_are_chosen_per_version() -> None:
    """A newer server's Job is not valid on an older one: the profile has to choose."""
    newest = [m for m in emitted(SUPPORTED[1]) if m["kind"] == "Job"]
    with pytest.raises(kubernetes_validate.ValidationError, match="podReplacementPolicy"):
        kubernetes_validate.validate(newest[0], "1.27", strict=True)  # alpha field from 1.28
    job_25 = next(m for m in emitted(25) if m["kind"] == "Job")
    job_29 = next(m for m in emitted(29) if m["kind"] == "Job")
    assert "podFailurePolicy" not in job_25["spec"]  # alpha and off by default on 1.25
    assert job_29["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
    assert job_29["spec"]["podReplacementPolicy"] == "Failed"


def test_a_fractional_grant_maps_to_hami_resources_and_the_uuid_annotation() -> None:
    pod = emitted(29)[0]
    main = pod["spec"]["containers"][0]
    assert main["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "10240",
        "nvidia.com/gpucores": "30",
        "cpu": "4000m",
        "memory": "16384Mi",
    }
    assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == "GPU-0"
    assert pod["metadata"]["namespace"] == "gpuplane-ml-research"
    assert pod["spec"]["activeDeadlineSeconds"] == 3601
    whole = emitted(29)[2]["spec"]["containers"][0]["resources"]["limits"]
    assert whole == {"nvidia.com/gpu": "2"}


def test_names_and_labels_fit_kubernetes_and_stay_distinct() -> None:
    ids = ["train-7f3a", "Eval_Run.42", "eval-run-42", "x" * 120, "x" * 121]
    names = [manifests.object_name(i) for i in ids]
    assert names[0] == "gp-train-7f3a"
    assert len(set(names)) == len(names)
    assert all(len(n) <= 63 and n == n.lower() for n in names)
    # an InferenceService's leaves room for the `-predictor` of the Service KServe makes
    deployed = [manifests.object_name(i, manifests.ISVC_NAME_MAX) for i in ids]
    assert deployed[0] == "gp-train-7f3a"
    assert len(set(deployed)) == len(deployed)
    assert all(len(f"{n}-predictor") <= 63 for n in deployed)
    value = manifests.label_value("host.example:8080")
    assert len(value) <= 63
    assert ":" not in value
    assert manifests.label_value("x" * 100) != manifests.label_value("x" * 101)


def test_the_namespace_template_is_checked_when_the_settings_load() -> None:
    with pytest.raises(ValidationError, match="may name only"):
        ClusterConfig.model_validate({"name": "k", "namespace": "ns-{project}"})
    with pytest.raises(ValidationError, match="not a namespace name"):
        ClusterConfig.model_validate({"name": "k", "namespace": "Teams_{team}"})


def test_hamis_annotation_is_read_in_both_forms() -> None:
    cards = [
        hami_card("GPU-1", index=0, mem_mib=81920, count=10),
        hami_card("GPU-2", index=1, mem_mib=81920, health=False, mode="mig"),
    ]
    expected = [
        HamiCard("GPU-1", 0, 10, 81920, 100, "NVIDIA-A100-SXM4-80GB", True),
        HamiCard("GPU-2", 1, 10, 81920, 100, "NVIDIA-A100-SXM4-80GB", False, "mig"),
    ]
    assert parse_register(encode_register(cards)) == expected
    legacy = parse_register(encode_register(cards, legacy=True))
    assert [(c.uuid, c.index, c.health, c.mode) for c in legacy] == [
        ("GPU-1", 0, True, "hami-core"),
        ("GPU-2", 1, False, "hami-core"),  # the 7-field form names no mode
    ]
    nine = parse_register("GPU-9,4,24576,100,NVIDIA L4,0,true,hami-core,3:")
    assert (nine[0].index, nine[0].model, nine[0].splittable) == (3, "L4", True)
    assert parse_register("") == []
    with pytest.raises(ValueError, match=r"entry 0 .* has 3 fields"):
        parse_register("GPU-1,10,81920:")
    with pytest.raises(ValueError, match="not HAMi's JSON"):
        parse_register('[{"id": "GPU-1"}]')


@pytest.mark.parametrize(
    ("version", "minor"),
    [
        ({"major": "1", "minor": "29"}, 29),
        ({"major": "1", "minor": "27+", "gitVersion": "v1.27.16-gke.1"}, 27),
        ({"major": "", "minor": "", "gitVersion": "v1.30.2-eks-1552ad0"}, 30),
        ({"major": "2", "minor": "0", "gitVersion": "v2.0.0"}, None),
    ],
)
def test_the_minor_version_is_read_as_vendors_write_it(
    version: dict[str, str], minor: int | None
) -> None:
    assert parse_minor(version) == minor


def test_a_server_missing_a_group_the_settings_need_is_refused() -> None:
    version = {"major": "1", "minor": "30", "gitVersion": "v1.30.1"}
    core = {"versions": ["v1"]}
    groups = {"groups": [{"versions": [{"groupVersion": "apps/v1"}]}]}
    with pytest.raises(AdapterError, match="does not serve batch/v1"):
        api_profile(version, core, groups, ["v1", "batch/v1"], "cluster k")
    assert api_profile(version, core, groups, ["v1"], "cluster k").minor == 30
