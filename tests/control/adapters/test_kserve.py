"""`gpuplane deploy render --target kserve`: each manifest is checked strictly against KServe's
InferenceService schema, through the `kserve` package's generated models (they mirror the CRD's
OpenAPI; no PyPI package ships the CRD YAML itself): every key must be a field of its model, every
required field present, every value of its type, recursively, with the `kubernetes` client's
models for the core types. The predictor's pod part is also checked as a Pod against the
Kubernetes OpenAPI schema (`kubernetes-validate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli import deploy as deploy_cli
from gpuplane.control.adapters import kserve
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.spec import SpecError
from tests.helpers.control import check, needs_kserve

pytestmark = needs_kserve

SPEC: dict[str, Any] = {
    "name": "chat",
    "model": "/models/qwen",
    "engine": "vllm",
    "team": "research",
    "slice": {"gpu_mem_mib": 20480, "gpu_cores_pct": 30, "cpu_millis": 4000, "memory_mib": 16384},
    "replicas": 2,
    "max_concurrency": 32,
    "engine_args": ["--dtype", "half"],
    "placement": {"gpu_models": ["A100-80GB"], "match_labels": {"pool": "serve"}},
}
CASES = {
    "vGPU slice, fixed replicas": SPEC,
    "whole cards, autoscaled, engine's own slots": {
        **{k: v for k, v in SPEC.items() if k not in ("replicas", "max_concurrency")},
        "slice": {"gpus": 2},
        "scaling": {"min": 1, "max": 4},
    },
    "a rollout": {**SPEC, "canary": [{"version": "v2.1", "weight": 10, "replicas": 1}]},
    "the simulator, no GPU": {"name": "sim", "model": "sim", "engine": "sim", "team": "t"},
    "llama.cpp": {"name": "tiny", "model": "/m/tiny.gguf", "engine": "llamacpp", "team": "t"},
}


def rendered(data: dict[str, Any], **opts: Any) -> list[dict[str, Any]]:
    return kserve.render(parse_deployment(data), image="registry.example/engine:1", **opts)


@pytest.mark.parametrize("case", CASES)
def test_every_rendering_is_a_valid_inference_service(case: str) -> None:
    for manifest in rendered(CASES[case], namespace="ml"):
        check(manifest, "V1beta1InferenceService", manifest["metadata"]["name"])
        predictor = manifest["spec"]["predictor"]
        pod_fields = ("containers", "nodeSelector", "affinity")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": manifest["metadata"]["name"]},
            "spec": {k: predictor[k] for k in pod_fields if k in predictor},
        }
        kubernetes_validate.validate(pod, "1.30", strict=True)


def test_the_checker_refuses_what_the_schema_refuses() -> None:
    good = rendered(SPEC)[0]
    typo = {**good, "spec": {"predictor": {**good["spec"]["predictor"], "minReplica": 1}}}
    with pytest.raises(AssertionError, match=r"\['minReplica'\] are not fields"):
        check(typo, "V1beta1InferenceService")
    container = dict(good["spec"]["predictor"]["containers"][0])
    del container["name"]
    nameless = {**good, "spec": {"predictor": {"containers": [container]}}}
    with pytest.raises(ValueError, match="name"):
        check(nameless, "V1beta1InferenceService")


def test_a_vgpu_deployment_in_raw_mode_with_hami_resources_and_engine_args() -> None:
    (isvc,) = rendered(SPEC, namespace="ml")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["metadata"]["namespace"] == "ml"
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 2)
    assert predictor["containerConcurrency"] == 32
    container = predictor["containers"][0]
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "20480",
        "nvidia.com/gpucores": "30",
        "cpu": "4000m",
        "memory": "16384Mi",
    }
    argv = container["command"]
    assert argv[:3] == ["vllm", "serve", "/models/qwen"]
    assert argv[argv.index("--max-num-seqs") + 1] == "32"
    assert argv[-2:] == ["--dtype", "half"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8080}


def test_whole_cards_autoscaled_and_a_rollout_per_version() -> None:
    (scaled,) = rendered(CASES["whole cards, autoscaled, engine's own slots"])
    predictor = scaled["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 4)
    assert "containerConcurrency" not in predictor  # the engine's own limit
    assert "--max-num-seqs" not in predictor["containers"][0]["command"]
    assert predictor["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    main, canary = rendered(CASES["a rollout"])
    assert [main["metadata"]["name"], canary["metadata"]["name"]] == ["chat-v1", "chat-v2-1"]
    weights = [m["metadata"]["annotations"]["gpuplane.io/weight"] for m in (main, canary)]
    assert weights == ["90", "10"]
    assert canary["metadata"]["labels"]["gpuplane.io/version"] == "v2.1"
    sim = rendered(CASES["the simulator, no GPU"])[0]["spec"]["predictor"]["containers"][0]
    assert "resources" not in sim or sim["resources"]["limits"] == {}
    assert "CUDA_VISIBLE_DEVICES" not in str(sim.get("env", []))


def test_what_cannot_run_on_kserve_is_refused_with_the_fix() -> None:
    with pytest.raises(SpecError, match="give the container image"):
        kserve.render(parse_deployment(SPEC), image="")
    digit = parse_deployment({**SPEC, "name": "7chat"})
    with pytest.raises(SpecError, match="start with a letter"):
        kserve.render(digit, image="i")


def test_the_cli_prints_the_manifests_as_yaml(tmp_path: Path) -> None:
    spec_file = tmp_path / "chat.yaml"
    spec_file.write_text(yaml.safe_dump(CASES["a rollout"]))
    args = ["render", str(spec_file), "--target", "kserve", "--image", "vllm/vllm-openai:v0.9.0"]
    result = CliRunner().invoke(deploy_cli.app, args)
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    assert [d["kind"] for d in docs] == ["InferenceService", "InferenceService"]
    result = CliRunner().invoke(deploy_cli.app, [*args[:3], "kservee", *args[4:]])
    assert result.exit_code != 0
    assert "kserve" in result.output
