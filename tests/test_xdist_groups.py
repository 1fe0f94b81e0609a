"""The suite's pytest-xdist groups hold under `--dist loadgroup`, as `make test` runs it: every
test of a group runs on one worker, so a heavy per-session backend (the Ray clusters) is started
once, never on two workers at a time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GROUPED = 6  # enough tests that an ungrouped run spreads them over both workers

SUITE = f"""
import os
import pytest

@pytest.fixture
def token_cluster():  # named in ONE_WORKER: its tests join the group "ray"
    return "stub"

def record(kind, out):
    with open(out, "a") as f:
        f.write(f"{{kind}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")

@pytest.fixture(scope="module")
def seed_fleet():  # named in ONCE_PER_MODULE: its tests join this module's group
    return "stub"

@pytest.mark.parametrize("i", range({GROUPED}))
def test_by_module_fixture(seed_fleet, i, out):
    record("module", out)

@pytest.mark.parametrize("i", range({GROUPED}))
def test_by_fixture(token_cluster, i, out):
    record("ray", out)

@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("i", range({GROUPED}))
def test_by_mark(i, out):
    record("ray", out)

@pytest.mark.parametrize("i", range({4 * GROUPED}))
def test_free(i, out):
    record("free", out)

@pytest.mark.parametrize("i", range({GROUPED}))
def test_by_module_fixture_last(seed_fleet, i, out):  # far from the first: another worker's
    record("module", out)
"""

CONFTEST = """
import pytest
from tests.conftest import pytest_collection_modifyitems  # the suite's hook, as it runs

@pytest.fixture
def out(pytestconfig):
    return pytestconfig.rootpath / "workers.txt"
"""


@pytest.mark.slow
def test_a_group_runs_on_one_worker_and_the_rest_spread(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_groups.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(request.config.rootpath), *sys.path])}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_groups.py"]
    done = subprocess.run(
        [*argv, "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in (tmp_path / "workers.txt").read_text().splitlines()]
    assert len(ran) == 4 * GROUPED + 4 * GROUPED
    assert len({worker for kind, worker in ran if kind == "ray"}) == 1, ran
    assert len({worker for kind, worker in ran if kind == "module"}) == 1, ran
    assert {worker for kind, worker in ran} == {"gw0", "gw1"}  # the others were spread
