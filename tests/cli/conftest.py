"""The CLI tests drive the control plane too: its fixtures and its guard that no job a test started
outlives it (tests/control/fixtures.py, job_guard.py)."""

from tests.control.fixtures import client, service  # noqa: F401 - fixtures
from tests.control.job_guard import no_job_outlives_the_test  # noqa: F401 - autouse
