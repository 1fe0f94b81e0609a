"""The Prometheus collector against a real Prometheus scraping recorded DCGM and HAMi pages."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpuplane.audit.collect import CollectError
from gpuplane.audit.collect.prometheus import PromClient, PromSeries, collect, samples
from gpuplane.audit.sample_store import SampleStore
from gpuplane.cli.main import app
from tests.helpers.common import free_port

PAGES = Path(__file__).with_name("prometheus")
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def exporter(page: str) -> Generator[str, None, None]:
    """A loopback exporter serving one recorded page at /metrics; yields its host:port."""
    body = (PAGES / page).read_bytes()
    list(text_string_to_metric_families(body.decode()))  # a well-formed page, or fail here

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None: ...

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway Prometheus on loopback scraping the DCGM and HAMi pages every second."""
    if not os.path.exists(PROMETHEUS):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    root = tmp_path_factory.mktemp("prometheus")
    dcgm, hami = exporter("dcgm.txt"), exporter("hami.txt")
    targets = {"dcgm": next(dcgm), "hami": next(hami)}
    jobs = "".join(
        f"  - job_name: {job}\n    honor_labels: true\n"
        f"    static_configs: [{{targets: ['{addr}']}}]\n"
        for job, addr in targets.items()
    )
    config = root / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}")
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / "log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # both pages scraped a few times: a window of 3 s has data throughout
            try:
                got = httpx.get(
                    f"{url}/api/v1/query",
                    params={"query": "count_over_time(up[1m]) >= 5 and up == 1"},
                ).json()
                if len(got["data"]["result"]) == 2:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"prometheus did not scrape: {(root / 'log').read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for gen in (dcgm, hami):
            gen.close()


def window(url: str, step_s: float = 1.0) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    client = PromClient(url)
    try:
        rows: list[dict[str, Any]] = collect(
            client, "c1", now - timedelta(seconds=3), now, step_s
        ).to_pylist()
        return rows
    finally:
        client.close()


@pytest.mark.slow
def test_a_shared_card_is_split_by_hamis_per_pod_figures_never_the_device_value(
    prometheus: str,
) -> None:
    rows = [r for r in window(prometheus) if r["card"] == "GPU-shared-0000"]
    assert rows
    assert {r["workload"] for r in rows} == {"ml/chat-a", "ml/embed-b"}
    for r in rows:
        assert r["card_mem_mib"] == 81920  # used + free + reserved
        assert r["node"] == "gpu-node-1"
        assert r["team"] == "ml"
        if r["workload"] == "ml/chat-a":
            assert (r["mem_used_mib"], r["alloc_mem_mib"], r["alloc_cores_pct"]) == (
                10240,
                20480,
                50,
            )
            assert r["compute_share"] == pytest.approx(0.30)
        else:  # two containers on the card add up
            assert (r["mem_used_mib"], r["alloc_mem_mib"], r["alloc_cores_pct"]) == (
                4096,
                10240,
                25,
            )
            assert r["compute_share"] == pytest.approx(0.10)
    # the device's 0.45 engine activity and 30000 MiB appear on no pod
    assert all(r["compute_share"] != pytest.approx(0.45) for r in rows)


@pytest.mark.slow
def test_whole_idle_and_time_sliced_cards(prometheus: str) -> None:
    rows = window(prometheus)
    whole = [r for r in rows if r["card"] == "GPU-whole-1111"]
    assert {r["workload"] for r in whole} == {"batch/train-x"}
    assert {(r["alloc_mem_mib"], r["alloc_cores_pct"], r["mem_used_mib"]) for r in whole} == {
        (81920, 100, 70000)
    }
    assert {round(r["compute_share"], 3) for r in whole} == {0.7}  # SM activity when enabled
    idle = [r for r in rows if r["card"] == "GPU-idle-2222"]
    assert {(r["workload"], r["mem_used_mib"], r["compute_share"]) for r in idle} == {("", 0, 0)}
    sliced = [r for r in rows if r["card"] == "GPU-sliced-3333"]
    assert {r["workload"] for r in sliced} == {"shop/web-1", "shop/web-2"}
    # DCGM's per-pod values there are the device's, copied: unknown, not 20000 MiB each
    assert {(r["mem_used_mib"], r["compute_share"]) for r in sliced} == {(None, None)}
    times = sorted({r["time"] for r in rows})
    assert len(times) >= 2
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(times))


@pytest.mark.slow
def test_cli_collects_a_window_and_a_refused_query_says_why(
    prometheus: str, tmp_path: Path
) -> None:
    out = tmp_path / "samples"
    args = ["audit", "collect", "-s", "prometheus", "--url", prometheus, "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--since", "3s", "--step", "1s"])
    assert result.exit_code == 0, result.output
    assert SampleStore(out).scan(columns=["card"]).num_rows >= 7  # one pass: 7 rows a step
    client = PromClient(prometheus)
    try:
        with pytest.raises(CollectError, match="refused 'sum\\(': bad_data"):
            client.query_range("sum(", 0, 1, 1)
    finally:
        client.close()


def test_an_unreachable_prometheus_names_the_url() -> None:
    client = PromClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(CollectError, match=r"cannot reach Prometheus at http://127\.0\.0\.1"):
        client.query_range("up", 0, 1, 1)
    client.close()


def test_hamis_legacy_names_are_read_like_the_current_ones() -> None:
    labels = {"podnamespace": "ml", "podname": "chat-a", "ctrname": "s", "deviceuuid": "GPU-x"}
    card = {"UUID": "GPU-x", "Hostname": "n1", "modelName": "A100"}
    fetched = {
        "fb_used": [PromSeries(card, [(60.0, 1000.0)])],
        "fb_free": [PromSeries(card, [(60.0, 80920.0)])],
        "gr_active": [PromSeries(card, [(60.0, 0.5)])],
        "ctr_mem_used": [PromSeries(labels, [(60.0, 512 * 2**20)])],
        "ctr_util": [PromSeries(labels, [(60.0, 12.0)])],
        "pod_cores": [PromSeries({**labels, "nodename": "n1"}, [(60.0, 25.0)])],
    }
    [row] = samples(fetched, "c1").to_pylist()
    assert (row["workload"], row["mem_used_mib"], row["alloc_cores_pct"]) == ("ml/chat-a", 512, 25)
    assert row["compute_share"] == pytest.approx(0.12)
    assert row["alloc_mem_mib"] is None  # no limit series: unknown


def test_a_long_window_is_asked_in_pieces_prometheus_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[float, float]] = []

    def fetch(
        self: PromClient, start: float, end: float, step_s: float
    ) -> dict[str, list[PromSeries]]:
        asked.append((start, end))
        return {}

    monkeypatch.setattr(PromClient, "fetch", fetch)
    client = PromClient("http://127.0.0.1:9")
    since = datetime(2026, 11, 1, tzinfo=UTC)
    collect(client, "c1", since, since + timedelta(days=14), step_s=60)
    client.close()
    assert all((end - start) / 60 + 1 <= 11_000 for start, end in asked)
    assert asked[0][0] == since.timestamp()
    assert all(b[0] - a[1] == 60 for a, b in itertools.pairwise(asked))  # no gap, no overlap
    assert asked[-1][1] >= (since + timedelta(days=14)).timestamp() - 60
