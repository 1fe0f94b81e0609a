"""Shared fixtures of the control tests: nothing a test started outlives it; one PostgreSQL server;
a service on embedded defaults (`service`) and the API over it in-process (`client`), which a test
module replaces by defining its own.

`no_job_outlives_the_test` runs for every test that has a `tmp_path` (the state dir of its
services and adapters). Its teardown comes after the test's own fixtures closed what they
started: a job the local adapter recorded there whose process (or a process of its session)
still runs is stopped, and the test fails naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.adapters._procs import JobProcess, JobRecord, session_orphans
from gpuplane.control.service import ControlService
from tests.control.svc_helpers import api_client, config, make_service


@pytest.fixture(autouse=True)
def no_job_outlives_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    if "tmp_path" not in request.fixturenames:
        yield
        return
    root: Path = request.getfixturevalue("tmp_path")
    yield
    outlived = []
    for path in sorted(root.rglob("run/*.json")):
        record = JobRecord.model_validate_json(path.read_bytes())
        job = JobProcess(record)
        if job.alive() or session_orphans(record.pid):
            outlived.append(record.job_id)
            job.stop(grace_s=1.0)
    assert outlived == [], f"jobs outlived the test: {', '.join(outlived)}"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = make_service(config(str(tmp_path)))
    yield svc
    svc.close()


@pytest.fixture
def client(service: ControlService) -> Iterator[TestClient]:
    with api_client(service) as c:
        yield c
