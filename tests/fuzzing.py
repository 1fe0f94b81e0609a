"""What the schemathesis passes over the two HTTP APIs share: the checks every answer meets and
hypothesis settings that keep each pass bounded and the same from run to run."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

# no 5xx, and every answer whose status the document lists matches its schema there
CHECKS = [not_a_server_error, response_schema_conformance]


def bounded(examples: int) -> settings:
    """At most `examples` cases per test, no deadline (a loaded CI machine is slow), derandomized
    and without a database, so CI reruns exactly the cases it ran before."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
