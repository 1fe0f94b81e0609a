"""The Grafana dashboards in deploy/grafana against a real Prometheus scraping a running gateway
(over a simulated engine, with traffic), a running control plane (with a running and a pending
job) and a batch run: every panel's every query parses and returns at least one series, and every
page passes `promtool check metrics`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuplane.batch.clips import list_clips
from gpuplane.batch.driver import Driver, RunOptions
from gpuplane.batch.exporter import BatchExporter
from gpuplane.batch.packing import declared_devices
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.runners.base import WorkerSpec, make_runner
from gpuplane.serve.settings import key_digest
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import (
    SLEEP,
    admin_token,
    config,
    job,
    make_service,
    wait_state,
)
from tests.helpers.batch import TOY, write_clips
from tests.helpers.common import free_port
from tests.helpers.e2e import gateway_over_sim

DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ADMIN_KEY, TENANT_KEY = "admin-key-for-the-test", "tenant-key-for-the-test"


def need(binary: str) -> None:
    if not os.path.exists(binary):
        message = f"{Path(binary).name} is not installed (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


def scrape_config(targets: dict[str, tuple[str, str | None]]) -> str:
    """Prometheus' config for `targets` (job -> host:port and the bearer token its /metrics
    wants, if any): the one place a new target or credential goes."""
    jobs = ""
    for name, (address, token) in targets.items():
        jobs += f"  - job_name: {name}\n    static_configs: [{{targets: ['{address}']}}]\n"
        if token is not None:
            jobs += f"    authorization: {{credentials: '{token}'}}\n"
    return f"global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    """A gateway with an admin key and one tenant (with a limit), over one simulated engine."""
    config = (
        f"gateway:\n  admin:\n    key_sha256: ['{key_digest(ADMIN_KEY)}']\n"
        f"tenants:\n  - name: team-a\n    key_sha256: ['{key_digest(TENANT_KEY)}']\n"
        "    limits: [{requests: 1000, window_s: 60}]\n"
    )
    with gateway_over_sim(tmp_path, config) as (url, _):
        yield url


def traffic(url: str) -> None:
    """A few answered chats for the tenant and one request for a model nobody serves."""
    headers = {"Authorization": f"Bearer {TENANT_KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for _ in range(4):
            chat = {"model": "smollm2", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
        refused = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=refused).status_code == 404


@pytest.fixture
def batch_metrics(tmp_path: Path) -> Iterator[str]:
    """A finished batch run's exporter, still serving (a live run's page, frozen)."""
    exporter = BatchExporter("toy")
    server, thread = exporter.serve(free_port())
    try:
        runner = make_runner("local", threads=True, cpu_slots=1)
        opts = RunOptions(tmp_path / "run", declared_devices(1))
        Driver(load_pipeline(TOY), WorkerSpec(TOY), runner, opts, exporter).run(
            list_clips(str(write_clips(tmp_path / "clips", 3))), total=3
        )
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def start_prometheus(root: Path, targets: dict[str, tuple[str, str | None]]) -> Any:
    (root / "prometheus.yml").write_text(scrape_config(targets))
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
         f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(root / "prometheus.log").open("wb"),
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def query(prom: str, expr: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(
        f"{prom}/api/v1/query", params={"query": expr}, timeout=30
    ).json()
    return answer


def wait_scraped(prom: str, proc: subprocess.Popen[bytes], jobs: int, log: Path) -> None:
    """Every target up and scraped a few times, so rates over a minute have points."""
    deadline = time.monotonic() + 90
    while True:
        try:
            got = query(prom, "count_over_time(up[1m]) >= 4 and up == 1")
            if len(got["data"]["result"]) == jobs:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            up = query(prom, "up") if proc.poll() is None else "exited"
            raise AssertionError(f"prometheus did not scrape every target: {up}; {log.read_text()}")
        time.sleep(0.5)


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) for every target of every panel, with Grafana's interval
    variable as a fixed minute."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            assert panel["targets"], f"{path.name}: panel {panel['title']!r} has no query"
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m")
                out.append((path.name, panel["title"], expr))
    return out


def promtool_check(page: bytes, what: str) -> None:
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=page, capture_output=True,
                           timeout=60)  # fmt: skip
    assert check.returncode == 0, f"{what}: {check.stdout.decode()}{check.stderr.decode()}"


@pytest.mark.slow
def test_every_panel_returns_series_from_a_real_prometheus(
    tmp_path: Path, gateway: str, batch_metrics: str
) -> None:
    need(PROMETHEUS)
    need(PROMTOOL)
    assert {p.name for p in DASHBOARDS.glob("*.json")} == {
        "gateway.json", "control.json", "batch.json"
    }  # fmt: skip
    traffic(gateway)
    service = make_service(config(str(tmp_path / "control"), gpus=2))
    try:
        running = service.submit(job("runs", command=SLEEP, gpus=1))["id"]
        wait_state(service, running, "running")
        waiting = service.submit(job("waits", command=SLEEP, gpus=2))["id"]
        with serving(service) as control:
            targets = {
                "gateway": (gateway.removeprefix("http://"), ADMIN_KEY),
                "control": (control.removeprefix("http://"), admin_token(service)),
                "batch": (batch_metrics, None),
            }
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            promtool_check(httpx.get(f"{gateway}/metrics", headers=admin).content, "gateway")
            bearer = {"Authorization": f"Bearer {admin_token(service)}"}
            promtool_check(httpx.get(f"{control}/metrics", headers=bearer).content, "control")
            promtool_check(httpx.get(f"http://{batch_metrics}/metrics").content, "batch")
            proc, prom = start_prometheus(tmp_path, targets)
            try:
                wait_scraped(prom, proc, len(targets), tmp_path / "prometheus.log")
                empty, broken = [], []
                for board, title, expr in panel_queries():
                    got = query(prom, expr)
                    if got.get("status") != "success":
                        broken.append(f"{board} {title!r}: {expr}: {got.get('error')}")
                    elif not got["data"]["result"]:
                        empty.append(f"{board} {title!r}: {expr}")
                assert not broken, "queries Prometheus refused:\n" + "\n".join(broken)
                assert not empty, "queries with no series:\n" + "\n".join(empty)
            finally:
                proc.terminate()
                proc.wait(30)
            # the tenant's traffic in the usage report, next to the store's allocations
            admin_key_file = tmp_path / "admin-key"
            admin_key_file.write_text(ADMIN_KEY + "\n")
            code, out = cli(
                control, "usage", "--since", "1h", "--step", "1s", "--gateway", gateway,
                "--admin-key", f"@{admin_key_file}", "-o", "json",
            )  # fmt: skip
        assert service.cancel(waiting)
    finally:
        service.close()
    assert code == 0, out
    tenants = {t["tenant"]: t for t in json.loads(out)["gateway"]["tenants"]}
    assert tenants["team-a"]["requests"] == 4
    assert tenants["team-a"]["completion_tokens"] > 0
    assert {t["team"] for t in json.loads(out)["teams"]} == {"research"}
