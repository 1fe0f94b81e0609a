"""`gpuplane quota set` changes one field at a time, names the CLI's options in the API's
validation errors, and reasons speak GPUs, as the CLI does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import QuotaConfig, TeamConfig
from gpuplane.control.store import team_edits
from gpuplane.control.store.views import QuotaSet, TeamSet
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import A100, config, job

FULL = QuotaConfig(
    flavor=A100,
    gpus=2,
    gpu_mem_mib=163840,
    borrowing_limit_gpus=1,
    borrowing_limit_mem_mib=81920,
    lending_limit_gpus=1.5,
    lending_limit_mem_mib=40960,
)
# declared only: what `quota set` changes is the API's (what the file states, it refuses)
TEAMS = (TeamConfig(name="research"), TeamConfig(name="vision"))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = ControlService(config(str(tmp_path), gpus=4, teams=TEAMS), bind_on_submit=False)
    svc.start()
    team_edits.set_team(svc, "research", TeamSet(cohort="ml", weight=2.0))
    team_edits.set_quota(svc, "research", A100, QuotaSet(**FULL.model_dump(exclude={"flavor"})))
    team_edits.set_quota(svc, "vision", A100, QuotaSet(gpus=0.5))
    yield svc
    svc.close()


@pytest.fixture
def url(service: ControlService) -> Iterator[str]:
    with serving(service) as u:
        yield u


def research(url: str) -> dict[str, Any]:
    code, out = cli(url, "quota", "show", "research", "-o", "json")
    assert code == 0, out
    team: dict[str, Any] = json.loads(out)
    return team


@pytest.mark.parametrize(
    ("option", "value", "field", "expected"),
    [
        ("--gpus", "3", "gpus", 3.0),
        ("--gpu-mem-mib", "1024", "gpu_mem_mib", 1024),
        ("--borrowing-limit-gpus", "2", "borrowing_limit_gpus", 2.0),
        ("--borrowing-limit-mem-mib", "2048", "borrowing_limit_mem_mib", 2048),
        ("--lending-limit-gpus", "0.5", "lending_limit_gpus", 0.5),
        ("--lending-limit-mem-mib", "4096", "lending_limit_mem_mib", 4096),
        ("--cohort", "vision-ml", "cohort", "vision-ml"),
        ("--weight", "3", "weight", 3.0),
    ],
)
def test_one_option_alone_changes_only_its_field(
    url: str, option: str, value: str, field: str, expected: object
) -> None:
    before = research(url)
    code, out = cli(url, "quota", "set", "research", option, value)
    assert code == 0, out
    after = research(url)
    flat = {**{k: v for k, v in before.items() if k != "quotas"}, **before["quotas"][0]}
    changed = {**{k: v for k, v in after.items() if k != "quotas"}, **after["quotas"][0]}
    assert changed == {**flat, field: expected}


def test_a_team_with_several_quotas_says_which_to_change(url: str) -> None:
    code, out = cli(url, "quota", "set", "research", "--gpu-model", "L4", "--gpus", "1")
    assert code == 1  # L4 is not in this inventory: refused by the API, with the known models
    assert "known models: A100-80GB" in out
    code, out = cli(url, "quota", "set", "nobody", "--borrowing-limit-gpus", "1")
    assert code == 2
    assert "with --gpu-model (it has: none yet)" in out
    code, out = cli(url, "quota", "set", "nobody", "--gpu-model", A100, "--lending-limit-gpus", "1")
    assert code == 2
    assert "give its nominal --gpus" in out
    code, out = cli(url, "quota", "set", "research")
    assert code == 2
    assert "give what to change" in out


def test_validation_errors_name_the_cli_options(url: str) -> None:
    code, out = cli(url, "quota", "set", "research", "--borrowing-limit-gpus", "-2")
    assert code == 1
    assert "--borrowing-limit-gpus: " in out
    assert "body." not in out
    assert research(url)["quotas"][0]["borrowing_limit_gpus"] == 1.0


def test_quota_reasons_say_gpus_not_milli_gpus(url: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job("greedy", team="vision", gpus=2)))
    code, out = cli(url, "job", "submit", str(spec))
    assert code == 0, out
    assert "submitted: pending" in out
    assert "0.5 GPUs" in out
    code, out = cli(url, "job", "describe", "greedy")
    assert code == 0, out
    assert "team vision would use 2 GPUs of its nominal 0.5 GPUs on A100-80GB" in out
    assert "milli" not in out
    assert "1500" not in out
