"""Shared fixtures of the control tests: nothing a test started outlives it (`job_guard.py`); one
PostgreSQL server; a service on embedded defaults (`service`) and the API over it in-process
(`client`), which a test module replaces by defining its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.service.service import ControlService
from tests.control.job_guard import no_job_outlives_the_test  # noqa: F401 - autouse
from tests.control.pg_server import create_database, postgres_server
from tests.control.svc_helpers import api_client, config, make_service


@pytest.fixture(scope="session")
def pg_database() -> Iterator[Callable[[], str]]:
    """One throwaway PostgreSQL server for the session (`pg_server.py`); each call of what it
    gives creates a fresh database there and returns its URL."""
    names = itertools.count()
    with postgres_server() as url:
        yield lambda: create_database(url, f"t{next(names)}")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = make_service(config(str(tmp_path)))
    yield svc
    svc.close()


@pytest.fixture
def client(service: ControlService) -> Iterator[TestClient]:
    with api_client(service) as c:
        yield c
