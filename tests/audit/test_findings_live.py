"""The audit end to end on a live local control plane: its store's allocations (part A's store
collector) joined with usage samples for the same jobs (what NVML or Prometheus would record:
allocation unknown, usage known), through findings and the re-pack plan."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuplane.audit.collect.store import collect
from gpuplane.audit.pipeline import run_audit
from gpuplane.audit.sample_store import SampleStore
from gpuplane.control.service.service import ControlService
from tests.audit.audit_helpers import _usage_rows
from tests.control.svc_helpers import config, job, make_service, wait_state

GIB = 1024


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[ControlService]:
    service = make_service(config(str(tmp_path), gpus=2))
    yield service
    service.close()


@pytest.mark.slow
def test_audit_of_a_live_control_plane_frees_the_card_its_oversized_jobs_spread_over(
    svc: ControlService, tmp_path: Path
) -> None:
    before = datetime.fromtimestamp(time.time() - 2, UTC)
    # neither fits beside the other as asked (60 + 40 GiB > 80), so they hold both cards
    a = svc.submit(job("a", gpu_mem_mib=60 * GIB, gpu_cores_pct=60))["id"]
    b = svc.submit(job("b", gpu_mem_mib=40 * GIB, gpu_cores_pct=50))["id"]
    wait_state(svc, a, "running")
    wait_state(svc, b, "running")
    time.sleep(3)
    after = datetime.fromtimestamp(time.time(), UTC)
    alloc = collect(svc.store.url, before, after, step_s=1)
    assert {r["card"] for r in alloc.to_pylist() if r["workload"] in (a, b)} == {"n0/0", "n0/1"}
    store = SampleStore(tmp_path / "samples")
    store.append(alloc)
    store.append(_usage_rows(alloc, a, 5 * GIB, 0.1))
    store.append(_usage_rows(alloc, b, 6 * GIB, 0.1))

    audit = run_audit(store)
    kinds = {(f.subject, str(f.kind)) for f in audit.findings}
    assert {(a, "oversized_memory"), (b, "oversized_memory")} <= kinds
    assert (a, "oversized_compute") in kinds
    assert audit.recommendations[a].mem_mib == 10 * GIB  # 5 GiB x 1.2 on the 1/8 grid
    assert audit.recommendations[a].alloc_mem_mib == 60 * GIB  # from the store's rows
    plan = audit.plan
    assert (plan.held_before, plan.held_after, plan.violations) == (2, 1, 0)
    moved = [m for m in plan.moves if m.action == "move"]
    assert len(moved) == 1
    assert moved[0].workload in (a, b)
