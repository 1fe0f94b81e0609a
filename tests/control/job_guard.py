"""The guard every control and console test runs under: nothing a test started outlives it.

`no_job_outlives_the_test` runs for every test that has a `tmp_path` (the state dir of its
services and adapters); a conftest imports it to make it autouse there. Its teardown comes after
the test's own fixtures closed what they started: a job the local adapter recorded there whose
process (or a process of its session) still runs is stopped, and the test fails naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.adapters.procs import JobProcess, JobRecord, session_orphans


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
