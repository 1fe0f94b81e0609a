"""The scale scenario end to end through the control-plane service, on SQLite and PostgreSQL.

Same estate and job mix as `scheduler_scale.py` (10,000 GPUs: 4 clusters x ~312 nodes x 8 cards,
A100 / H100 / L40S / A10, and a backlog of mixed jobs: vGPU slices, 1-8 whole cards, CPU-only,
half with selectors), but every placement goes through `ControlService`: quota admission, the
scheduler core, and the commit of job rows and device allocations in the store's locked
transaction. Binding (starting processes) is left out: admitted jobs are not bound (no tick runs).

Two ways in, per store:
  backlog  all jobs queued with one `submit_many` (one transaction), then ONE admission pass over
           the whole queue: placements/s = placed / pass time (end to end: / queue + pass time).
  online   jobs submitted one at a time with `submit` (own transaction + pass + commit each) on a
           fresh store; a job that does not fit now is cancelled at once (counted as refused);
           placements/s = placed / total time, and p50 / p99 of one submit.
PostgreSQL runs on a throwaway server started from the Debian binaries (as in the tests).

    .venv/bin/python benchmarks/control_service_scale.py                  # 50,000 jobs
    .venv/bin/python benchmarks/control_service_scale.py --jobs 5000 --online 500 --stores sqlite
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _extras import optional_imports  # noqa: E402

with optional_imports():
    import numpy as np
    from sqlalchemy import func, select

    from _results import save
    from gpuplane.control.scheduler import Request, Snapshot, feasible
    from gpuplane.control.service.service import ControlService
    from gpuplane.control.settings import (
        ClusterConfig,
        ControlConfig,
        DeclaredGpus,
        DeclaredNode,
        TeamConfig,
    )
    from gpuplane.control.store.models import ACTIVE_STATES, Allocation, Device, Job
    from gpuplane.resources import LABEL_VGPU
    from scheduler_scale import CLUSTERS, backlog, inventory

RESULTS = ROOT / "benchmarks" / "results" / "control_service_scale.json"
GIB = 1024
TEAMS = [f"team-{k}" for k in range(8)]


def clusters() -> list[ClusterConfig]:
    out = []
    for name, region, model, card_mem, count, split in CLUSTERS:
        nodes = [
            DeclaredNode(
                name=f"{name}-{i:04d}",
                cpu_millis=128_000,
                memory_mib=1024 * GIB,
                labels={LABEL_VGPU: str(split).lower(), "rack": f"r{i // 16}"},
                gpus=[DeclaredGpus(model=model, mem_mib=card_mem, count=8)],
            )
            for i in range(count)
        ]
        out.append(ClusterConfig(name=name, region=region, discover_gpus=False, nodes=nodes))
    return out


def spec(request: Request, k: int) -> dict[str, Any]:
    """A job spec (as a user writes it) for one request of the scenario."""
    resources: dict[str, Any] = {"cpu_millis": request.cpu_millis, "memory_mib": request.memory_mib}
    if request.gpus:
        resources["gpus"] = request.gpus
    elif request.is_fractional:
        resources["gpu_mem_mib"] = request.gpu_mem_mib
        resources["gpu_cores_pct"] = request.gpu_milli // 10
    selector: dict[str, Any] = {}
    if request.selector.gpu_models:
        selector["gpu_models"] = sorted(request.selector.gpu_models)
    if request.selector.match_labels:
        selector["match_labels"] = dict(request.selector.match_labels)
    return {
        "name": f"job-{k}",
        "team": TEAMS[k % len(TEAMS)],
        "command": ["true"],
        "resources": resources,
        "selector": selector,
    }


def check_no_double_booking(service: ControlService) -> int:
    with service.store.session() as s:
        over = s.execute(
            select(Device.id)
            .join(Allocation, Allocation.device_id == Device.id)
            .group_by(Device.id, Device.mem_mib)
            .having(
                (func.sum(Allocation.mem_mib) > Device.mem_mib)
                | (func.sum(Allocation.gpu_milli) > 1000)
            )
        ).all()
        assert not over, f"over-allocated devices: {over[:5]}"
        return int(
            s.scalar(select(func.count()).select_from(Job).where(Job.state.in_(ACTIVE_STATES))) or 0
        )


def make(url: str, state_dir: str, policy: str) -> tuple[ControlService, float]:
    teams = [TeamConfig(name=t) for t in TEAMS]  # a job must name a declared team
    cfg = ControlConfig(
        state_dir=state_dir, database_url=url, clusters=clusters(), teams=teams, policy=policy
    )
    t0 = time.perf_counter()
    service = ControlService(cfg, bind_on_submit=False, new_id=lambda name: name)
    service.start()
    return service, time.perf_counter() - t0


def run_backlog(
    url: str, state_dir: str, specs: list[dict[str, Any]], policy: str
) -> dict[str, Any]:
    service, start_s = make(url, state_dir, policy)
    try:
        t0 = time.perf_counter()
        service.submit_many(specs, admit=False)
        t1 = time.perf_counter()
        placed = service.schedule_pass()
        t2 = time.perf_counter()
        assert check_no_double_booking(service) == placed
        queue_s, pass_s = t1 - t0, t2 - t1
        return {
            "jobs": len(specs),
            "placed": placed,
            "inventory_sync_seconds": round(start_s, 2),
            "queue_seconds": round(queue_s, 2),
            "pass_seconds": round(pass_s, 2),
            "placements_per_s": round(placed / pass_s, 1),
            "end_to_end_placements_per_s": round(placed / (queue_s + pass_s), 1),
            "submits_per_s": round(len(specs) / queue_s, 1),
        }
    finally:
        service.close()


def run_online(
    url: str, state_dir: str, specs: list[dict[str, Any]], policy: str
) -> dict[str, Any]:
    service, _ = make(url, state_dir, policy)
    times = np.zeros(len(specs))
    placed = 0
    try:
        t_all = time.perf_counter()
        for k, item in enumerate(specs):
            t0 = time.perf_counter()
            job_id = service.submit(item)["id"]
            times[k] = time.perf_counter() - t0
            with service.store.session() as s:
                state = s.scalar(select(Job.state).where(Job.id == job_id))
            if state == "pending":
                service.cancel(job_id)
            else:
                placed += 1
        total = time.perf_counter() - t_all
        assert check_no_double_booking(service) == placed
        return {
            "jobs": len(specs),
            "placed": placed,
            "seconds": round(total, 2),
            "placements_per_s": round(placed / total, 1),
            "submit_p50_ms": round(float(np.percentile(times, 50)) * 1e3, 2),
            "submit_p99_ms": round(float(np.percentile(times, 99)) * 1e3, 2),
        }
    finally:
        service.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000, help="backlog size")
    ap.add_argument("--online", type=int, default=2_000, help="jobs submitted one at a time")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--policy", default="best-fit")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = ap.parse_args()
    requests = backlog(args.jobs, np.random.default_rng(args.seed))
    # the service refuses impossible requests at submit (a whole batch with them): leave them out
    empty = Snapshot(inventory())
    possible = [r for r in requests if feasible(empty, r).ok]
    impossible = len(requests) - len(possible)
    specs = [spec(r, k) for k, r in enumerate(possible)]
    print(f"{impossible} of {len(requests)} jobs can never fit (refused at submit): left out")
    print(
        f"10,000 GPUs in {len(CLUSTERS)} clusters; backlog {len(specs)} jobs, online "
        f"{args.online}; policy {args.policy}"
    )
    rows = []
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        for store in [s.strip() for s in args.stores.split(",") if s.strip()]:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuplane-bench-"))
            if store == "sqlite":
                urls = [f"sqlite:///{tmp}/backlog.db", f"sqlite:///{tmp}/online.db"]
            else:
                from tests.control.pg_server import create_database, postgres_server

                server = stack.enter_context(postgres_server())
                urls = [create_database(server, "backlog"), create_database(server, "online")]
            b = run_backlog(urls[0], tmp, specs, args.policy)
            o = run_online(urls[1], tmp, specs[: args.online], args.policy)
            rows.append({"store": store, "backlog": b, "online": o})
            print(
                f"{store:<10} backlog: {b['placed']} placed, pass {b['pass_seconds']} s -> "
                f"{b['placements_per_s']:.0f} placements/s (end to end incl. queueing "
                f"{b['end_to_end_placements_per_s']:.0f}/s)"
            )
            print(
                f"{'':<10} online:  {o['placed']}/{o['jobs']} placed, "
                f"{o['placements_per_s']:.0f} placements/s, submit p50 {o['submit_p50_ms']} ms"
                f" p99 {o['submit_p99_ms']} ms"
            )
    if len(rows) == 2:
        ratio = rows[0]["backlog"]["placements_per_s"] / rows[1]["backlog"]["placements_per_s"]
        print(f"backlog placements/s, {rows[0]['store']} / {rows[1]['store']}: {ratio:.2f}")
    out = {
        "benchmark": "control_service_scale (end to end through the service)",
        "gpus": 10_000,
        "nodes": sum(c[4] for c in CLUSTERS),
        "jobs": args.jobs,
        "impossible_left_out": impossible,
        "online_jobs": args.online,
        "policy": args.policy,
        "seed": args.seed,
        "binding": "excluded (admitted jobs are committed to the store, not started)",
        "host_load_average_1m": {
            "before": round(load_before, 2),
            "after": round(os.getloadavg()[0], 2),
        },
        "results": rows,
    }
    save(out, args.out)


if __name__ == "__main__":
    main()
