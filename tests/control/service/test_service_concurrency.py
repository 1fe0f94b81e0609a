"""Concurrent submits through two services on one SQLite file: never double-book, never exceed
quota. Two `ControlService` objects on one store stand for two service processes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpuplane.control.settings import ControlConfig
from tests.control.svc_helpers import (
    assert_no_device_over_allocated,
    assert_quota_respected,
    config,
    job,
    make_service,
    submit_concurrently,
)
from tests.helpers.control import LIMITS, TEAMS, shapes


def run(cfg: ControlConfig, specs: list[dict[str, Any]]) -> None:
    first, second = make_service(cfg, "a"), make_service(cfg, "b")
    try:
        ids = submit_concurrently([first, second], specs)
        assert len(set(ids)) == len(specs)
        for svc in (first, second):
            svc.tick()
        assert_no_device_over_allocated(first)
        assert_quota_respected(first, LIMITS)
        # what the store says is what each service's mirror says
        for svc in (first, second):
            estate, _ = svc.estate()
            with svc.store.session() as session:
                from sqlalchemy import func, select

                from gpuplane.control.store.models import ACTIVE_STATES, Job

                active = session.scalar(
                    select(func.count()).select_from(Job).where(Job.state.in_(ACTIVE_STATES))
                )
            assert len(estate.snapshot.allocations) == active
    finally:
        first.close()
        second.close()


def test_many_concurrent_submits_fill_the_cards_exactly_once(tmp_path: Path) -> None:
    specs = [job(f"w{i}", team="ab"[i % 2], gpus=1) for i in range(16)]
    specs += [
        job(f"f{i}", team="ab"[i % 2], gpu_mem_mib=20480, gpu_cores_pct=20) for i in range(16)
    ]
    run(config(str(tmp_path), nodes=2, gpus=4, teams=TEAMS), specs)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example starts two services
)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), shapes), min_size=4, max_size=14))
def test_property_no_device_over_allocated_and_no_quota_exceeded(
    jobs: list[tuple[str, dict[str, Any]]],
) -> None:
    specs = [job(f"p{i}", team=team, **res) for i, (team, res) in enumerate(jobs)]
    with tempfile.TemporaryDirectory() as tmp:
        run(config(tmp, nodes=2, gpus=2, teams=TEAMS), specs)
