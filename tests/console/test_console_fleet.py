"""The console's deployments, batch runs and overview history through the ASGI app: what each
page shows from a running control plane (a deployment on the sim engine with a gateway's load
report, a real batch run, allocations and audit samples), and that a member sees only its team."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from gpuplane.audit.collect.store import Card, Holding
from gpuplane.audit.history import allocated
from gpuplane.audit.sample_store import SampleStore
from gpuplane.control.identity.auth import Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import TeamConfig
from gpuplane.control.store.models import Job
from gpuplane.plane import control_app
from tests.audit.audit_helpers import series
from tests.console.console_helpers import batch_run, console_client
from tests.control.svc_helpers import A100, config, job, make_service, wait_state

DEPLOYMENT = {
    "name": "chat",
    "model": "sim",
    "version": "v1",
    "engine": "sim",
    "replicas": 1,
    "team": "research",
    "slice": {"gpu_mem_mib": 8192, "gpu_cores_pct": 25},
    "max_concurrency": 4,
    "canary": [{"version": "v2", "weight": 10}],
}


@dataclass
class Plane:
    svc: ControlService
    http: TestClient
    member: str  # research
    other: str  # a member of vision

    def page(self, url: str, token: str) -> tuple[int, str]:
        browser, _ = console_client(self.http, token)
        r = browser.get(url)
        return r.status_code, _text(r.text)


def _text(html: str) -> str:
    """A page's text, tags dropped and spaces collapsed (what a reader sees)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    teams = (TeamConfig(name="research"), TeamConfig(name="vision"))
    cfg = config(str(tmp_path / "state"), teams=teams).model_copy(
        update={
            "runs_dirs": {"research": str(tmp_path / "runs")},
            "samples_dir": str(tmp_path / "samples"),
        }
    )
    svc = make_service(cfg)
    try:
        member = svc.tokens.create("m", Role.member, "research")[1]
        other = svc.tokens.create("o", Role.member, "vision")[1]
        with TestClient(control_app(svc, background=False), base_url="http://127.0.0.1") as http:
            yield Plane(svc, http, member, other)
    finally:
        svc.close()


def test_the_deployments_pages_show_versions_instances_and_reported_slots(plane: Plane) -> None:
    plane.svc.deployments.apply(DEPLOYMENT)
    status, listing = plane.page("/ui/deployments", plane.member)
    assert status == 200
    assert "chat" in listing
    assert "v1 (90 %, " in listing
    assert "v2 (10 %, " in listing
    assert "no gateway reports" in listing

    described = plane.http.get(
        "/deployments/chat", headers={"authorization": f"Bearer {plane.member}"}
    ).json()
    ids = [i["id"] for i in described["instances"]]
    for i in ids:
        wait_state(plane.svc, i, "running")
    plane.svc.deployments.loads.report(
        "gw-1",
        [
            {
                "name": "chat",
                "in_flight": 1,
                "queued": 0,
                "oldest_wait_s": 0.0,
                "idle_s": 0.0,
                "ready": len(ids),
                "instances": {ids[0]: 1},
                "ready_ids": ids,
            }
        ],
    )
    status, page = plane.page("/ui/deployments/chat", plane.member)
    assert status == 200
    capacity = sum(i["capacity"] for i in described["instances"])
    assert f"1 of {capacity}, as the gateways last reported" in page
    first, second = described["instances"]
    assert f"{ids[0]} v1 running local n0 0 1 of {first['capacity']}" in page
    assert f"{ids[1]} v2 running local n0 0 0 of {second['capacity']}" in page
    assert "v1 90 % 1 1 1 0 v2 10 % 1 1 1 0" in page  # weight, wanted, running, ready, draining

    # another team: the list is empty, the page answers as an unknown deployment
    status, theirs = plane.page("/ui/deployments", plane.other)
    assert status == 200
    assert "chat" not in theirs
    assert "no deployments" in theirs
    hidden, _ = plane.page("/ui/deployments/chat", plane.other)
    unknown, _ = plane.page("/ui/deployments/nosuch", plane.other)
    assert hidden == unknown == 404


def test_the_batch_runs_pages_show_a_teams_runs_and_their_reports(
    plane: Plane, tmp_path: Path
) -> None:
    summary = batch_run(tmp_path / "runs" / "toy-a", tmp_path / "batch")
    broken = tmp_path / "runs" / "torn"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    status, listing = plane.page("/ui/runs", plane.member)
    assert status == 200
    assert f"toy-a research {summary['pipeline']} finished 3 0" in listing
    assert "torn research cannot read" in listing
    status, page = plane.page("/ui/runs/research/toy-a", plane.member)
    assert status == 200
    assert "3 done, 0 failed, over 1 invocation(s)" in page
    for stage in summary["stages"]:
        assert f" {stage} " in page
    assert "clip-0000 done 1 computed" in page

    status, theirs = plane.page("/ui/runs", plane.other)
    assert status == 200
    assert "toy-a" not in theirs
    hidden, _ = plane.page("/ui/runs/research/toy-a", plane.other)
    assert hidden == 404


def test_a_run_summary_of_the_wrong_shape_is_an_error_row_not_a_failed_page(
    plane: Plane, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    good = runs / "good"
    good.mkdir(parents=True)
    (good / "run.json").write_text(json.dumps({"pipeline": "toy", "status": "running"}))
    for name, doc in (
        ("counts", {"pipeline": "toy", "status": "finished", "clips": "many"}),
        ("stages", {"status": "finished", "stages": {"a": {"computed": "lots"}}}),
        ("listed", [1, 2, 3]),
        ("wall", {"status": "finished", "wall_s": "slow"}),
    ):
        (runs / name).mkdir()
        (runs / name / "run.json").write_text(json.dumps(doc))
    status, listing = plane.page("/ui/runs", plane.member)
    assert status == 200
    assert "good research toy running 0 0" in listing
    assert f"counts research {runs / 'counts' / 'run.json'} is not a run summary: clips:" in listing
    assert "stages.a.computed:" in listing
    assert f"{runs / 'listed' / 'run.json'} is not a run summary" in listing
    assert "wall_s:" in listing
    status, page = plane.page("/ui/runs/research/stages", plane.member)
    assert status == 200
    assert "is not a run summary: stages.a.computed" in page


def test_a_symbolic_link_under_a_runs_dir_is_not_followed(plane: Plane, tmp_path: Path) -> None:
    theirs = tmp_path / "vision-runs" / "secret"
    theirs.mkdir(parents=True)
    (theirs / "run.json").write_text(json.dumps({"pipeline": "their-pipeline"}))
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "stolen").symlink_to(theirs, target_is_directory=True)
    (runs / "half").mkdir()
    (runs / "half" / "run.json").symlink_to(theirs / "run.json")
    status, listing = plane.page("/ui/runs", plane.member)
    assert status == 200
    assert "their-pipeline" not in listing
    assert f"{runs / 'stolen'} is a symbolic link: not followed" in listing
    assert f"{runs / 'half' / 'run.json'} is a symbolic link: not followed" in listing
    status, page = plane.page("/ui/runs/research/stolen", plane.member)
    assert status == 200
    assert "their-pipeline" not in page


def test_the_overview_shows_allocated_and_used_gpus_over_time(plane: Plane, tmp_path: Path) -> None:
    status, page = plane.page("/ui?window=1h", plane.member)
    assert status == 200
    assert "local A100-80GB 2 0.00 0.00 0.00 -" in page  # nothing held, nothing measured
    assert "not measured" in page
    job_id = plane.svc.submit(job("train", gpus=1))["id"]
    wait_state(plane.svc, job_id, "running")
    now = int(time.time())
    with plane.svc.store.session() as session:  # as if it had started half an hour ago
        session.execute(update(Job).where(Job.id == job_id).values(started_at=now - 1800))
        session.commit()
    samples = series(job_id, [1000.0] * 5, [0.5] * 5, start=now - 600)
    cluster = samples.schema.get_field_index("cluster")
    local = pa.array(["local"] * samples.num_rows).dictionary_encode()
    SampleStore(tmp_path / "samples").append(samples.set_column(cluster, "cluster", local))
    status, page = plane.page("/ui?window=1h", plane.member)
    assert status == 200
    row = re.search(r"local A100-80GB 2 (\d\.\d\d) (\d\.\d\d) (\d\.\d\d) (\d\.\d\d)", page)
    assert row is not None, page
    last, mean, peak, used = (float(g) for g in row.groups())
    assert (last, peak) == (1.0, 1.0)  # one card, held through the last step
    assert mean == pytest.approx(0.5, abs=0.03)  # for the last half of the hour
    assert used == pytest.approx(0.5)  # what the samples say it used
    bad = plane.page("/ui?window=2h", plane.member)
    assert bad[0] == 422
    assert "did you mean '1h'" in bad[1] or "valid: 1h" in bad[1]


def test_history_counts_a_slice_as_its_share_over_the_part_of_each_step_it_held() -> None:
    cards = [Card("c", "n", 0, A100, 81920), Card("c", "n", 1, A100, 81920)]
    holdings = [
        # a quarter slice from 30 s to 90 s: half of each of the first two steps
        Holding("a", "t", "c", "n", 0, 30.0, 90.0, 20480, 25),
        # a whole card from 100 s on, still held: the last 20 s of step two, all of step three
        Holding("b", "t", "c", "n", 1, 100.0, None, None, 100),
    ]
    got = allocated(cards, holdings, [0.0, 60.0, 120.0], 60.0)
    assert got[("c", A100)] == pytest.approx([0.125, 0.125 + 20 / 60, 1.0])
