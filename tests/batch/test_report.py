"""The run report as a reader sees it: a summary without an empty row, the runner in words, each
stage linked to its cache entries, and one row per clip with its stage outcomes and metrics."""

from __future__ import annotations

from pathlib import Path

from gpuplane.batch.report import write_report
from tests.helpers.batch import RunFn, clip_table, parse, write_clips


def test_report_has_a_clean_summary_and_one_sortable_row_per_clip(
    run_toy: RunFn, tmp_path: Path
) -> None:
    clips = write_clips(tmp_path / "with-broken", 5, broken=(1,))
    summary = run_toy("a", clip_dir=clips)
    page = parse(write_report(summary, tmp_path / "a"))

    _, overview = page.tables[0]
    assert all(all(cell for cell in row) for row in overview)  # no empty (header) row
    assert ["runner", "local threads, 2 workers"] in overview

    head, *rows = clip_table(page)
    assert head == ["clip", "status", "attempts", "perception", "size_check", "sum_check",
                    "parity_check", "size_check (reduced)", "sum_check (reduced)",
                    "parity_check (reduced)"]  # fmt: skip
    by_clip = {r[0]: r for r in rows}
    assert len(rows) == len(by_clip) == 5
    assert by_clip["clip-0001"][1:7] == ["failed at perception", "1", "failed", "-", "-", "-"]
    assert by_clip["clip-0000"][1:7] == ["done", "1", *["computed"] * 4]
    assert by_clip["clip-0000"][7] == "500"  # its reduced size_check
    assert page.scripts == 1  # the sort, inline

    cache_dirs = [link for link in page.links if link.startswith("file://")]
    assert cache_dirs == [(tmp_path / "cache" / n / "1").as_uri() + "/" for n in
                          ("perception", "size_check", "sum_check", "parity_check")]  # fmt: skip


def test_report_of_a_run_served_from_cache_says_cached_per_clip(
    run_toy: RunFn, tmp_path: Path
) -> None:
    run_toy("a")
    summary = run_toy("b")
    _, *rows = clip_table(parse(write_report(summary, tmp_path / "b")))
    assert len(rows) == 12
    assert {cell for r in rows for cell in r[3:7]} == {"cached"}
