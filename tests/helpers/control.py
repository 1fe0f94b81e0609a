"""Helpers of the control-plane tests: the concurrency tests' teams and shapes, waiting on
an adapter, and checking a KServe manifest against KServe's generated models."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import time
import types
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st

from gpuplane.control.adapters import (
    WorkloadState,
    WorkloadStatus,
)
from gpuplane.control.adapters.kubernetes import KubernetesAdapter
from gpuplane.control.settings import QuotaConfig, TeamConfig
from tests.control.svc_helpers import A100

T = TypeVar("T")

TEAMS = [
    TeamConfig(
        name="a", cohort="ml", quotas=[QuotaConfig(flavor=A100, gpus=3, borrowing_limit_gpus=1)]
    ),
    TeamConfig(name="b", cohort="ml", quotas=[QuotaConfig(flavor=A100, gpus=2)]),
    TeamConfig(name="c"),  # declared without quotas: not limited
]


LIMITS = {"a": (3000, 1000), "b": (2000, None)}


shapes = st.one_of(
    st.builds(lambda n: {"gpus": n}, st.integers(1, 2)),
    st.builds(
        lambda m, c: {"gpu_mem_mib": m, "gpu_cores_pct": c},
        st.integers(1024, 81920),
        st.integers(1, 100),
    ),
)


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def ended(adapter: KubernetesAdapter, job_id: str) -> WorkloadStatus:
    def probe() -> WorkloadStatus | None:
        status = adapter.status([job_id])[job_id]
        return status if status.state != WorkloadState.RUNNING else None

    return wait_for(probe, f"{job_id} to end", timeout=120)


def check(value: Any, type_name: str, path: str = "") -> None:
    """`value` (decoded YAML) is a valid `type_name`, strictly; fails naming the path."""
    if type_name in _PRIMITIVES:
        assert isinstance(value, _PRIMITIVES[type_name]), (path, value)
        assert type_name != "int" or not isinstance(value, bool), (path, value)
        return
    if m := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        assert isinstance(value, list), (path, value)
        for i, item in enumerate(value):
            check(item, m.group(1), f"{path}[{i}]")
        return
    if m := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        assert isinstance(value, dict), (path, value)
        for k, item in value.items():
            check(item, m.group(1) or m.group(2), f"{path}.{k}")
        return
    cls = _model_class(type_name)
    assert isinstance(value, dict), (path, type_name, value)
    fields = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = set(value) - set(fields)
    assert not unknown, f"{path}: {sorted(unknown)} are not fields of {type_name}"
    for key, item in value.items():
        check(item, cls.openapi_types[fields[key]], f"{path}.{key}")
    cls(**{fields[k]: v for k, v in value.items()})  # its setters refuse a missing required field


KSERVE = importlib.util.find_spec("kserve")
# the schema checks need KServe's generated models (tests/control/test_k8s_deploy.py too)
needs_kserve = pytest.mark.skipif(
    KSERVE is None,
    reason="the kserve package's models are missing: `pip install --no-deps kserve==0.21.0` "
    "(make setup does)",
)


def _model_class(name: str) -> type[Any]:
    """A generated model class by its OpenAPI name: KServe's (`V1beta1…`) or the Kubernetes
    client's (`V1Container`, …). KServe's models are loaded without `kserve/__init__.py`, which
    starts its model-server stack (grpc, cloudevents) that a schema check does not need."""
    if name.startswith(("V1beta1", "V1alpha1")):
        if "kserve" not in sys.modules:
            pkg = types.ModuleType("kserve")
            assert KSERVE is not None
            assert KSERVE.submodule_search_locations is not None
            pkg.__path__ = list(KSERVE.submodule_search_locations)
            sys.modules["kserve"] = pkg
        snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
        module = importlib.import_module(f"kserve.models.{snake}")
        return getattr(module, name)  # type: ignore[no-any-return]
    import kubernetes.client

    return getattr(kubernetes.client, name)  # type: ignore[no-any-return]


_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (float, int),
    "object": (object,),
}
