"""Helpers of the batch tests: the toy pipeline and its clips, what a run should write, the
processes it leaves, and the report's and summary's parsers."""

from __future__ import annotations

import json
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from gpuplane.batch.journal import read_records

TOY = str(Path(__file__).parents[1] / "batch" / "toy_pipeline.py")


def write_clips(root: Path, n: int, broken: tuple[int, ...] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = (b"FAIL" if i in broken else b"") + bytes((i * 7 + j) % 251 for j in range(500 + i))
        (root / f"clip-{i:04d}.bin").write_bytes(body)
    return root


RunFn = Callable[..., dict[str, Any]]


def children(pid: int | str = "self") -> list[int]:
    """The child processes of `pid` (of every thread of it), read from /proc. A thread that
    ends while they are read had none left: it is skipped."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return out


def expected(clips: Path) -> dict[str, dict[str, int]]:
    out = {}
    for p in sorted(clips.iterdir()):
        data = p.read_bytes()
        out[p.stem] = {"size_check": len(data), "sum_check": sum(data) % 97,
                       "parity_check": sum(data) % 3}  # fmt: skip
    return out


def outputs(run_dir: Path) -> dict[str, dict[str, int]]:
    return {k: v["out"] for k, v in read_records(run_dir / "results.jsonl").items()}


def parse(path: Path) -> Tables:
    page = Tables()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def clip_table(page: Tables) -> list[list[str]]:
    (rows,) = [rows for cls, rows in page.tables if "clips" in cls.split()]
    return rows


def strict_json(text: str) -> Any:
    """json.loads that refuses what JSON does not have (NaN, Infinity), as other parsers do."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


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
