"""Job time limits: the spec, the store and enforcement by the service. Their use in admission is
tested with its modules: backfilling (`admission/test_nominate.py`), the queue order
(`admission/test_order.py`) and delay scheduling (`admission/test_delay.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, text

from gpuplane.control.service.service import ControlService
from gpuplane.control.spec import SpecError, format_duration, parse_spec
from gpuplane.control.store import queries
from gpuplane.control.store.models import Event
from gpuplane.control.store.store import Store
from tests.control.svc_helpers import job, old_store, wait_state

# -- the spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(7200, 7200.0), (90.5, 90.5), ("2h", 7200.0), ("90m", 5400.0), ("1h30m", 5400.0),
     ("45s", 45.0), ("1d", 86400.0), ("1.5h", 5400.0), ("600", 600.0)],
)  # fmt: skip
def test_time_limit_takes_seconds_or_a_duration(given: object, seconds: float) -> None:
    spec = parse_spec({"name": "a", "team": "t", "command": ["x"], "time_limit": given})
    assert spec.time_limit == seconds
    assert spec.to_request("j").time_limit_s == seconds


@pytest.mark.parametrize("given", [0, -5, "0s", "2x", "h", "", "soon", True, [1]])
def test_a_bad_time_limit_says_what_is_accepted(given: object) -> None:
    with pytest.raises(SpecError, match=r"time_limit: must be a positive duration.*'90m'"):
        parse_spec({"name": "a", "team": "t", "command": ["x"], "time_limit": given})


def test_no_time_limit_is_no_limit_and_durations_print_as_they_are_read() -> None:
    assert parse_spec({"name": "a", "team": "t", "command": ["x"]}).time_limit is None
    assert [format_duration(s) for s in (45, 5400, 7200, 93600)] == ["45s", "1h30m", "2h", "1d2h"]


# -- the store and the service ---------------------------------------------------------------


def test_upgrading_a_store_gives_old_jobs_no_time_limit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    old_store(
        url,
        "0003",
        "INSERT INTO teams (name, cohort, weight) VALUES ('old', NULL, 1.0)",
        "INSERT INTO jobs (id, name, team_name, state, priority, spec, reasons, "
        "milli_gpus, gpu_mem_mib, cpu_millis, memory_mib, attempts, created_at) "
        "VALUES ('j', 'j', 'old', 'succeeded', 0, '{}', '{}', 0, 0, 0, 0, 0, 1.0)",
    )
    store = Store.open(url)
    try:
        with store.engine.connect() as conn:
            row = conn.execute(text("SELECT state, time_limit_s FROM jobs WHERE id = 'j'")).one()
        assert tuple(row) == ("succeeded", None)
    finally:
        store.close()


def test_a_job_past_its_time_limit_is_stopped_and_fails_saying_why(
    service: ControlService,
) -> None:
    jid = service.submit({**job("slow", gpus=1), "time_limit": "1s"})["id"]
    popen = service.adapters["local"]._runs[jid].popen  # type: ignore[attr-defined]
    row = wait_state(service, jid, "succeeded", "failed", "cancelled")
    assert row.state == "failed"
    assert row.time_limit_s == 1.0
    assert "exceeded its time limit" in (row.message or "")
    assert popen.poll() is not None  # the process was stopped
    assert service.adapters["local"].workloads() == []
    view = queries.get_job(service, jid)
    assert view.time_limit_s == 1.0
    with service.store.session() as session:
        kinds = [e.kind for e in session.scalars(select(Event).where(Event.job_id == jid))]
        messages = list(session.scalars(select(Event.message).where(Event.job_id == jid)))
    assert kinds[-1] == "failed"
    assert "exceeded its time limit" in messages[-1]
    assert queries.list_clusters(service)[0].gpus_free == 2


def test_a_job_within_its_time_limit_is_left_alone(service: ControlService) -> None:
    quick = job("quick", command=["python", "-c", "print(1)"], gpus=1)
    jid = service.submit({**quick, "time_limit": "1h"})["id"]
    assert wait_state(service, jid, "succeeded", "failed").state == "succeeded"
