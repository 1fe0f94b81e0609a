"""Every number a user sets has a range: the schema states it, and a value outside it is refused
with a 422 (or a config error) that names the field and the range, never a 500."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from gpuplane.config import load_settings
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig, TeamConfig
from gpuplane.control.spec import JobSpec
from gpuplane.control.store.views import QuotaSet, TeamSet
from gpuplane.errors import ConfigError
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import A100, config, job, make_service

INT32 = "from -2147483648 to 2147483647"
QUOTA_GPUS = "from 0 to 1000000"
WEIGHT = "from 0.001 to 1000"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = make_service(config(str(tmp_path), teams=[TeamConfig(name="research")]))
    yield svc
    svc.close()


def send(client: TestClient, method: str, path: str, body: Any) -> Any:
    """`body` as Python's json writes it: inf and NaN as the Infinity and NaN tokens."""
    return client.request(
        method, path, content=json.dumps(body), headers={"content-type": "application/json"}
    )


def detail(response: Any) -> str:
    """The 422's message: the spec's own, or FastAPI's per-field errors joined."""
    body = response.json()["detail"]
    if isinstance(body, str):
        return body
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in body)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("priority", 2**63, INT32),
        ("priority", -(2**63), INT32),
        ("priority", 1e308, INT32),
        ("time_limit", 1e308, "from 1 to 315360000"),
        ("resources.gpus", 2**40, "from 0 to 1024"),
        ("resources.gpu_mem_mib", 2**63, "from 1 to 16777216"),
        ("resources.gpu_cores_pct", 101, "from 1 to 100"),
        ("resources.cpu_millis", 2**31, "from 0 to 2147483647"),
        ("resources.memory_mib", 2**63, "from 0 to 2147483647"),
    ],
)
def test_a_job_spec_number_out_of_range_is_a_422_naming_field_and_range(
    client: TestClient, field: str, value: Any, rule: str
) -> None:
    spec = job("big")
    if field.startswith("resources."):
        spec["resources"] = {field.removeprefix("resources."): value}
    else:
        spec[field] = value
    r = send(client, "POST", "/jobs", spec)
    assert r.status_code == 422, r.text
    assert f"{field}: must be" in detail(r)
    assert rule in detail(r)
    assert client.get("/jobs").json() == []


def test_a_priority_is_a_signed_32_bit_integer_as_the_store_keeps_it(client: TestClient) -> None:
    for k, priority in enumerate((2**31 - 1, -(2**31))):
        r = send(client, "POST", "/jobs", {**job(f"edge{k}", gpus=1), "priority": priority})
        assert r.status_code == 201, r.text
        assert client.get(f"/jobs/{r.json()['id']}").json()["priority"] == priority
    r = send(client, "POST", "/jobs", {**job("past", gpus=1), "priority": 2**31})
    assert r.status_code == 422
    assert f"priority: must be {INT32}, got 2147483648" in detail(r)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", float("inf")),
        ("gpus", 1e308),
        ("gpus", float("nan")),
        ("borrowing_limit_gpus", float("inf")),
        ("lending_limit_gpus", 1e308),
    ],
)
def test_a_quota_of_infinity_or_1e308_is_a_422_naming_field_and_range(
    client: TestClient, field: str, value: float
) -> None:
    body = {"gpus": 1, field: value}
    r = send(client, "PUT", f"/teams/research/quotas/{A100}", body)
    assert r.status_code == 422, r.text
    assert f"body.{field}: must be {QUOTA_GPUS}" in detail(r)
    assert client.get("/teams/research").json()["quotas"] == []


def test_a_quota_of_gpu_memory_past_the_store_column_is_a_422(client: TestClient) -> None:
    r = send(client, "PUT", f"/teams/research/quotas/{A100}", {"gpus": 1, "gpu_mem_mib": 2**63})
    assert r.status_code == 422
    assert "body.gpu_mem_mib: must be from 0 to 2147483647" in detail(r)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), 0, 1e-320, 1e308])
def test_a_team_weight_of_nan_is_a_422_naming_field_and_range(
    client: TestClient, weight: float
) -> None:
    r = send(client, "PUT", "/teams/research", {"weight": weight})
    assert r.status_code == 422, r.text
    assert f"body.weight: must be {WEIGHT}" in detail(r)
    assert client.get("/teams/research").json()["weight"] == 1.0


def test_an_unknown_field_of_a_quota_body_is_refused_not_ignored(client: TestClient) -> None:
    r = send(client, "PUT", f"/teams/research/quotas/{A100}", {"gpus": 1, "borrow_gpus": 2})
    assert r.status_code == 422
    assert "body.borrow_gpus" in detail(r)


def numeric_fields(model: type[BaseModel]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(model.field, JSON schema) of every integer or number field, nested models included."""
    schema = model.model_json_schema()
    for name, defn in [(model.__name__, schema), *schema.get("$defs", {}).items()]:
        for field, prop in defn.get("properties", {}).items():
            options = prop.get("anyOf", [prop])
            numbers = [o for o in options if o.get("type") in ("integer", "number")]
            for option in numbers:
                yield f"{name}.{field}", {**option, "description": prop.get("description", "")}


@pytest.mark.parametrize("model", [JobSpec, QuotaSet, TeamSet, ControlConfig])
def test_every_number_a_user_sets_has_a_documented_range(model: type[BaseModel]) -> None:
    fields = list(numeric_fields(model))
    assert fields
    for name, prop in fields:
        assert "minimum" in prop, f"{name} has no lower bound"
        assert "maximum" in prop, f"{name} has no upper bound"
        low, high = (
            f"{v:g}" if isinstance(v, float) else v for v in (prop["minimum"], prop["maximum"])
        )
        assert f"from {low} to {high}" in prop["description"], name


def test_the_openapi_schema_states_the_ranges(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    gpus = schemas["QuotaSet"]["properties"]["gpus"]
    assert (gpus["minimum"], gpus["maximum"]) == (0, 1_000_000)
    assert QUOTA_GPUS in gpus["description"]


def test_a_config_file_with_an_infinite_quota_names_the_key_and_range(tmp_path: Path) -> None:
    path = tmp_path / "gpuplane.yaml"
    team = {"name": "research", "weight": ".nan", "quotas": [{"flavor": A100, "gpus": ".inf"}]}
    path.write_text(
        yaml.safe_dump({"control": {"teams": [team]}})
        .replace("'.inf'", ".inf")
        .replace("'.nan'", ".nan")
    )
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert f"control.teams.0.quotas.0.gpus: must be {QUOTA_GPUS}, got inf" in str(err.value)
    assert f"control.teams.0.weight: must be {WEIGHT}, got nan" in str(err.value)
    with pytest.raises(
        ValidationError, match=re.escape("schedule_interval_s\n  must be from 0.01 to 3600")
    ):
        ControlConfig(schedule_interval_s=float("inf"))


def test_the_cli_shows_the_field_and_range_and_exits_non_zero(
    service: ControlService, tmp_path: Path
) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text(yaml.safe_dump({**job("big", gpus=1), "priority": 2**63}))
    with serving(service) as url:
        code, out = cli(url, "quota", "set", "research", "--gpu-model", A100, "--gpus", "inf")
        assert code == 1
        assert "HTTP 422" in out
        assert f"gpus: must be {QUOTA_GPUS}, got inf" in out
        code, out = cli(url, "quota", "set", "research", "--weight", "nan")
        assert code == 1
        assert f"weight: must be {WEIGHT}, got nan" in out
        code, out = cli(url, "job", "submit", str(spec))
        assert code == 1
        assert f"priority: must be {INT32}, got 9223372036854775808" in out
        assert "Traceback" not in out
