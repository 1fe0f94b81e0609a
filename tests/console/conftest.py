"""The console tests run under the control tests' guard: nothing a test started outlives it."""

from tests.control.job_guard import no_job_outlives_the_test  # noqa: F401 - autouse
