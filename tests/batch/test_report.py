"""The run report as a reader sees it: a summary without an empty row, the runner in words, each
stage linked to its cache entries, and one row per clip with its stage outcomes and metrics."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from gpuplane.batch.report import write_report
from tests.batch.conftest import RunFn, write_clips


class Tables(HTMLParser):
    """Every table of a page: its class, its rows as cell texts, and its links' targets."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.links: list[str] = []
        self.scripts = 0
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append((dict(attrs).get("class") or "", []))
        elif tag == "tr":
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self.links.append(dict(attrs).get("href") or "")
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(path: Path) -> Tables:
    page = Tables()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def clip_table(page: Tables) -> list[list[str]]:
    (rows,) = [rows for cls, rows in page.tables if "clips" in cls.split()]
    return rows


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
