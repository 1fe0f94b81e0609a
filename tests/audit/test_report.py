"""The audit's HTML report in a real headless Chromium, and the CLI end to end on a store."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from gpuplane.audit.fleet import Fleet, FleetSpec, generate
from gpuplane.audit.pipeline import run_audit
from gpuplane.audit.recommend import replay
from gpuplane.audit.report import render, write_report
from gpuplane.audit.sample_store import SampleStore
from gpuplane.audit.samples import TRAFFIC_SCHEMA
from gpuplane.audit.usage import usage
from gpuplane.cli.main import app

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def small_fleet() -> Fleet:
    return generate(5, FleetSpec(days=1))


@pytest.mark.slow
def test_report_renders_in_chromium_with_plots_and_tables(
    small_fleet: Fleet, tmp_path: Path
) -> None:
    if not shutil.which(CHROMIUM) and os.environ.get("CI") != "true":
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    samples, tr = small_fleet.samples(), small_fleet.traffic()
    audit = run_audit(samples, tr)
    path = write_report(
        audit, usage(samples, audit.stats.window, audit.settings), tmp_path / "report.html",
        replay(samples, audit.recommendations.values()),
    )  # fmt: skip
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: errors.append(r.url) if r.url.startswith("http") else None)
            page.goto(path.as_uri())
            for plot in ("plot-fleet", "plot-findings", "plot-cardmap"):
                assert page.evaluate(f"document.getElementById('{plot}').naturalWidth") > 100
            for table in (
                "findings-by-team",
                "thresholds-table",
                "recommendations-table",
                "usage-table",
            ):
                assert page.locator(f"#{table} tr").count() > 1, table
            assert "idle_compute" in page.inner_text("#thresholds-table")
            assert "reconciled" in page.inner_text("#usage-table")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []  # no console error, no request off the page
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_report_names_what_was_not_evaluated(small_fleet: Fleet) -> None:
    samples = small_fleet.samples()
    audit = run_audit(samples)
    html = render(audit, usage(samples, audit.stats.window, audit.settings))
    assert "zero_traffic was not evaluated" in html
    assert "http://" not in html
    assert "https://" not in html


@pytest.mark.slow
def test_cli_audits_a_store_end_to_end(small_fleet: Fleet, tmp_path: Path) -> None:
    store, traffic = tmp_path / "samples", tmp_path / "traffic"
    SampleStore(store).append(small_fleet.samples())
    SampleStore(traffic, TRAFFIC_SCHEMA).append(small_fleet.traffic())
    runner = CliRunner()
    args = ["--store", str(store), "--traffic", str(traffic)]
    found = runner.invoke(app, ["audit", "findings", *args, "-o", "json"])
    assert found.exit_code == 0, found.output
    kinds = {f["kind"] for f in json.loads(found.output)}
    assert {"idle_held", "zero_traffic", "oversized_memory"} <= kinds
    plan = runner.invoke(app, ["audit", "plan", *args, "--plans", str(tmp_path / "plans"),
                               "-o", "yaml"])  # fmt: skip
    assert plan.exit_code == 0, plan.output
    plan_id = next(line.split()[1] for line in plan.output.splitlines() if line.startswith("id:"))
    assert (tmp_path / "plans" / f"{plan_id}.json").is_file()
    used = runner.invoke(app, ["audit", "usage", *args])
    assert used.exit_code == 0
    assert "reconciled" in used.output
    out = tmp_path / "r.html"
    assert runner.invoke(app, ["audit", "report", *args, "--out", str(out)]).exit_code == 0
    assert out.read_text().startswith("<!doctype html>")


def test_cli_refuses_a_missing_store_and_two_sources(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["audit", "findings", "--store", str(tmp_path / "none")])
    assert missing.exit_code == 1
    assert "gpuplane audit collect" in missing.output
    both = runner.invoke(app, ["audit", "plan", "--store", str(tmp_path), "--fleet", "1"])
    assert both.exit_code == 1
    assert "not both" in both.output
    empty = runner.invoke(app, ["audit", "findings", "--store", str(tmp_path)])
    assert empty.exit_code == 1
    assert "holds no samples" in empty.output


def test_report_escapes_what_samples_say(small_fleet: Fleet) -> None:
    """A team or workload name is data: markup in it reaches the page as text, never as HTML."""
    evil = "<script>alert(1)</script>"
    samples = small_fleet.samples()
    for column in ("team", "workload"):
        i = samples.schema.get_field_index(column)
        names = [f"{evil}{v}" if v else v for v in samples.column(column).to_pylist()]
        samples = samples.set_column(i, column, pa.array(names).dictionary_encode())
    audit = run_audit(samples)
    html = render(audit, usage(samples, audit.stats.window, audit.settings))
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
