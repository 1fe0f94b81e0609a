"""The control tests' fixtures, shared by tests/control and tests/cli through their conftests:
a service on embedded defaults (`service`) and the API over it in-process (`client`), which a
test module replaces by defining its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.service.service import ControlService
from tests.control.svc_helpers import api_client, config, make_service


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    svc = make_service(config(str(tmp_path)))
    yield svc
    svc.close()


@pytest.fixture
def client(service: ControlService) -> Iterator[TestClient]:
    with api_client(service) as c:
        yield c
