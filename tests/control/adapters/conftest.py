"""The adapter tests' shared backend: one real local Ray cluster per session (`ray_cluster.py`),
started only by the tests that ask for it (all marked slow)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.control.adapters.ray_cluster import RayNode, ray_cluster

# a head with two 80 GiB cards and a worker with two L4s (declared: Ray needs no GPU for them)
RAY_NODES = [
    RayNode("head", 2, 2 * 81920, {"gpuplane.io/gpu-model": "A100-80GB"}),
    RayNode("w1", 2, 2 * 24576, {"gpuplane.io/gpu-model": "L4"}),
]


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The job API URL of a local Ray cluster of two nodes on 127.0.0.1, for the session."""
    with ray_cluster(RAY_NODES, tmp_path_factory.mktemp("ray")) as cluster:
        yield cluster.url
