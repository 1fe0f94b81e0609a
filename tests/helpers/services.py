"""The servers the tests run for real (Redis, etcd): where their binaries are, and a skip
(a failure in CI) naming the package to install when one is missing."""

from __future__ import annotations

import os

import pytest

REDIS = "/usr/bin/redis-server"


def require(binary: str, package: str) -> None:
    if os.path.exists(binary):
        return
    msg = f"{binary} not found; run .ci/services.sh (apt-get install {package})"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)
