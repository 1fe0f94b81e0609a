"""Shared fixtures of the control tests: nothing a test started outlives it (`job_guard.py`); a
service on embedded defaults and the API over it (`fixtures.py`).
"""

from tests.control.fixtures import client, service  # noqa: F401 - fixtures
from tests.control.job_guard import no_job_outlives_the_test  # noqa: F401 - autouse
