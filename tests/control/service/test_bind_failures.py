"""One bad job never jams the shared loop: whatever binding it raises fails that job with the
reason, the other admitted jobs start, and later submits answer as usual."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.control.adapters import Workload
from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import Job
from tests.control.svc_helpers import (
    api_client,
    assert_no_device_over_allocated,
    config,
    job,
    make_service,
    state,
    wait_state,
)

QUICK = [sys.executable, "-c", "print('fine')"]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    """Three cards; admitted jobs are bound by `tick()`, as the background loop does."""
    svc = ControlService(config(str(tmp_path), gpus=3), bind_on_submit=False)
    svc.start()
    yield svc
    svc.close()


def admit(service: ControlService, *specs: dict[str, Any]) -> list[str]:
    ids = [service.submit(spec)["id"] for spec in specs]
    assert [state(service, i).state for i in ids] == ["admitted"] * len(ids)
    return ids


def assert_fails_alone(service: ControlService, bad: str, good: str, *words: str) -> None:
    """`bad` failed saying `words`; `good` (admitted with it) ran; a later submit runs too."""
    service.tick()
    row = state(service, bad)
    assert row.state == "failed"
    for word in words:
        assert word in (row.message or ""), row.message
    assert wait_state(service, good, "succeeded", "failed").state == "succeeded"
    later = service.submit(job("later", command=QUICK, gpus=1))["id"]
    assert wait_state(service, later, "succeeded", "failed").state == "succeeded"
    assert_no_device_over_allocated(service)


def test_an_env_name_no_process_can_take_fails_only_that_job(service: ControlService) -> None:
    bad, good = admit(
        service,
        {**job("bad", command=QUICK, gpus=1), "env": {"A=B": "x"}},  # Popen: ValueError
        job("good", command=QUICK, gpus=1),
    )
    assert_fails_alone(service, bad, good, "cannot be passed to a process", "env")


def test_a_nul_byte_in_a_spec_queued_before_it_was_refused_fails_only_that_job(
    service: ControlService,
) -> None:
    bad, good = admit(
        service, job("bad", command=QUICK, gpus=1), job("good", command=QUICK, gpus=1)
    )
    waiting = service.submit(job("waiting", command=QUICK, gpus=3))["id"]  # pending: no room
    with service.store.session() as session, session.begin():  # as an older gpuplane queued them
        for job_id in (bad, waiting):
            row = session.get(Job, job_id)
            assert row is not None
            row.spec = {**row.spec, "command": ["echo", "a\x00b"]}
    service.invalidate()
    assert_fails_alone(service, bad, good, "command", "NUL byte", "submit a corrected spec")
    row = state(service, waiting)  # the admission pass does not choke on it either
    assert row.state == "failed"
    assert "NUL byte" in (row.message or "")


def test_a_missing_executable_fails_only_that_job(service: ControlService) -> None:
    bad, good = admit(
        service,
        job("bad", command=["no-such-binary-xyz"], gpus=1),
        job("good", command=QUICK, gpus=1),
    )
    assert_fails_alone(service, bad, good, "cannot start 'no-such-binary-xyz'", "No such file")


def test_a_missing_workdir_fails_only_that_job(service: ControlService, tmp_path: Path) -> None:
    gone = str(tmp_path / "no-such-dir")
    bad, good = admit(
        service,
        {**job("bad", command=QUICK, gpus=1), "workdir": gone},
        job("good", command=QUICK, gpus=1),
    )
    assert_fails_alone(service, bad, good, f"cannot run in workdir '{gone}'", "fix `workdir`")


def test_a_command_without_permission_to_run_fails_only_that_job(
    service: ControlService, tmp_path: Path
) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)  # not executable (root too needs an x bit to exec)
    bad, good = admit(
        service, job("bad", command=[str(script)], gpus=1), job("good", command=QUICK, gpus=1)
    )
    assert_fails_alone(service, bad, good, "Permission denied", "executable?")


def test_an_unforeseen_error_from_an_adapter_fails_only_that_job(
    service: ControlService, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = service.adapters["local"]
    bind = adapter.bind

    def broken(workload: Workload) -> None:  # a bug for one job: what an unforeseen error does
        if workload.name == "bad":
            raise RuntimeError("a bug in the adapter")
        bind(workload)

    monkeypatch.setattr(adapter, "bind", broken)
    bad, good = admit(
        service, job("bad", command=QUICK, gpus=1), job("good", command=QUICK, gpus=1)
    )
    assert_fails_alone(service, bad, good, "RuntimeError: a bug in the adapter", "log")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("command", ["echo", "a\x00b"]),
        ("env", {"A": "x\x00y"}),
        ("env", {"A\x00": "x"}),
        ("workdir", "/tmp/a\x00b"),
    ],
)
def test_a_nul_byte_is_refused_at_submit_naming_the_field(
    tmp_path: Path, field: str, value: object
) -> None:
    svc = make_service(config(str(tmp_path)))
    try:
        with api_client(svc) as client:
            response = client.post("/jobs", json={**job("nul", command=QUICK), field: value})
            assert response.status_code == 422, response.text
            assert f"{field}: holds a NUL byte" in response.json()["detail"]
            ok = client.post("/jobs", json=job("ok", command=QUICK))
            assert ok.status_code == 201, ok.text
    finally:
        svc.close()
