"""`gpuplane audit apply` on a live local control plane: a plan made from its store, then the
plan's job move carried out over the real HTTP API (`POST /jobs/{ref}/move`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpuplane.audit.apply import LiveJob, plan_state, save_plan
from gpuplane.audit.collect.store import collect
from gpuplane.audit.sample_store import SampleStore
from gpuplane.cli import audit_review
from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import Event
from tests.audit.audit_helpers import _usage_rows
from tests.control.api_server import serving
from tests.control.svc_helpers import admin_token, config, job, make_service, state, wait_state

GIB = 1024
_app = typer.Typer()
audit_review.register(_app)


def audit(
    *args: str, answer: str | None = None, env: dict[str, str] | None = None
) -> tuple[int, str]:
    result = CliRunner().invoke(_app, list(args), input=answer, env=env)
    return result.exit_code, result.output


@dataclass(slots=True)
class Planned:
    svc: ControlService
    url: str
    plans: Path
    plan_id: str
    move: dict[str, Any]  # the plan's one job move
    stays: str  # the job the plan leaves where it is


@pytest.fixture
def planned(tmp_path: Path) -> Iterator[Planned]:
    """Two nodes of one 80 GiB card each; two oversized jobs hold both (60 + 40 GiB do not fit
    on one card); their usage (5 and 6 GiB) lets the plan move one beside the other."""
    svc = make_service(config(str(tmp_path), nodes=2, gpus=1))
    try:
        before = datetime.fromtimestamp(time.time() - 2, UTC)
        a = svc.submit(job("a", command=["sleep", "8"], gpu_mem_mib=60 * GIB))["id"]
        b = svc.submit(job("b", command=["sleep", "8"], gpu_mem_mib=40 * GIB))["id"]
        wait_state(svc, a, "running")
        wait_state(svc, b, "running")
        time.sleep(2)
        alloc = collect(svc.store.url, before, datetime.fromtimestamp(time.time(), UTC), step_s=1)
        store = SampleStore(tmp_path / "samples")
        store.append(alloc)
        store.append(_usage_rows(alloc, a, 5 * GIB, 0.1))
        store.append(_usage_rows(alloc, b, 6 * GIB, 0.1))
        plans = tmp_path / "plans"
        code, out = audit("plan", "--store", str(store.root), "--plans", str(plans), "-o", "json")
        assert code == 0, out
        data = json.loads(out)
        (move,) = [m for m in data["moves"] if m["action"] == "move"]
        assert move["from_node"] != move["to_node"]
        with serving(svc) as url:
            stays = b if move["workload"] == a else a
            yield Planned(svc, url, plans, data["id"], move, stays)
    finally:
        svc.close()


def apply(p: Planned, *extra: str, answer: str | None = None) -> tuple[int, str]:
    token = admin_token(p.svc)
    args = (
        "apply",
        p.plan_id,
        "--plans",
        str(p.plans),
        "--server",
        p.url,
        *extra,
    )
    return audit(*args, answer=answer, env={"GPUPLANE_TOKEN": token})


def _node(svc: ControlService, job_id: str) -> str | None:
    _estate, ids = svc.estate()
    names = {v: k for k, v in ids.nodes.items()}
    row = state(svc, job_id)
    return None if row.node_id is None else names[row.node_id].partition("/")[2]


def _events(svc: ControlService, job_id: str) -> list[str]:
    with svc.store.session() as session:
        return [e.kind for e in session.query(Event).filter(Event.job_id == job_id)]


@pytest.mark.slow
def test_a_move_re_places_the_running_job_on_its_target_keeping_its_id(planned: Planned) -> None:
    moved = planned.move["workload"]
    code, out = apply(planned, "--yes")
    assert code == 0, out
    assert f"moved {moved} to local/{planned.move['to_node']}" in out
    row = wait_state(planned.svc, moved, "running")
    assert _node(planned.svc, moved) == planned.move["to_node"]
    assert row.attempts == 1  # the same job, its second run; nothing resubmitted
    assert row.spec["resources"]["gpu_mem_mib"] == planned.move["mem_mib"]  # the plan's slice
    assert "moved" in _events(planned.svc, moved)
    assert state(planned.svc, planned.stays).attempts == 0  # the other job was not touched
    done = wait_state(planned.svc, moved, "succeeded", "failed")
    assert (done.state, done.exit_code) == ("succeeded", 0)
    assert _node(planned.svc, moved) == planned.move["to_node"]


@pytest.mark.slow
def test_a_second_apply_is_a_no_op(planned: Planned) -> None:
    moved = planned.move["workload"]
    assert apply(planned, "--yes")[0] == 0
    wait_state(planned.svc, moved, "running")
    code, out = apply(planned, "--yes")
    assert code == 0, out
    assert "nothing to do (1 job moves done)" in out
    assert state(planned.svc, moved).attempts == 1
    assert _events(planned.svc, moved).count("moved") == 1


@pytest.mark.slow
def test_a_stale_plan_is_refused_naming_the_workload_that_changed(planned: Planned) -> None:
    planned.svc.cancel(planned.stays)
    code, out = apply(planned, "--yes")
    assert code == 1
    assert "stale" in out
    assert f"job {planned.stays} is cancelled" in out
    moved = state(planned.svc, planned.move["workload"])
    assert (moved.state, moved.attempts) == ("running", 0)  # nothing was moved


@pytest.mark.slow
def test_a_plan_changed_after_it_was_saved_is_refused(planned: Planned) -> None:
    path = planned.plans / f"{planned.plan_id}.json"
    data = json.loads(path.read_text())
    data["moves"][0]["to_node"] = "n9"
    path.write_text(json.dumps(data))
    code, out = apply(planned, "--yes")
    assert code == 1
    assert f"plan {planned.plan_id} does not match its content" in out
    renamed = planned.plans / "0123456789abcdef.json"
    renamed.write_text(json.dumps({**data, "id": "0123456789abcdef"}))
    code, out = audit(
        "apply", "0123456789abcdef", "--plans", str(planned.plans), "--server", planned.url
    )
    assert code == 1
    assert "does not match its content" in out
    assert state(planned.svc, planned.move["workload"]).attempts == 0


@pytest.mark.slow
def test_apply_asks_first_and_stops_at_the_first_failure_saying_what_was_not_done(
    planned: Planned,
) -> None:
    path = planned.plans / f"{planned.plan_id}.json"
    data = json.loads(path.read_text())
    # a second move, to a node that is not there: the control plane refuses it
    bad = {**planned.move, "workload": planned.stays, "to_node": "n9", "to_card": "n9/0"}
    bad["from_node"] = data["placements"][planned.stays][1]
    data["moves"].append(bad)
    save_plan(planned.plans, {k: v for k, v in data.items() if k != "checksum"})
    code, out = apply(planned, answer="n\n")
    assert code == 1
    assert "move 2 jobs?" in out
    assert state(planned.svc, planned.move["workload"]).attempts == 0  # answered no
    code, out = apply(planned, "--yes")
    assert code == 1
    assert f"moved {planned.move['workload']} to" in out
    assert f"moving job {planned.stays} failed" in out
    assert f"moved 1 of 2 (not moved: {planned.stays})" in out
    assert state(planned.svc, planned.move["workload"]).attempts == 1
    assert state(planned.svc, planned.stays).attempts == 0
    code, out = apply(planned, "--yes")  # the re-run goes on from the failed move
    assert "moved 0 of 1" in out


def test_deployment_moves_are_counted_and_left_out() -> None:
    move = {"workload": "chat", "kind": "inference", "action": "move", "from_node": "n0",
            "to_node": "n1", "to_cluster": "c"}  # fmt: skip
    data = {"moves": [move], "placements": {"chat": ["c", "n0", "n0/0", 1024, 100]}}
    s = plan_state(data, {"chat": None}, [])
    assert (s.deployments, s.todo, s.changed) == ([move], [], [])


def test_a_job_placed_after_the_plan_makes_it_stale() -> None:
    job_ = LiveJob("j", "running", "c", "n0", "n0/0", None)
    data = {"moves": [], "placements": {"j": ["c", "n0", "n0/0", 1024, 100]}}
    assert plan_state(data, {"j": job_}, ["k"]).changed == [
        "job k was placed after the plan was made"
    ]
