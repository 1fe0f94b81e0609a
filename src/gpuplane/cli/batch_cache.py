"""`gpuplane batch cache`: list, measure and trim the stage cache. Thin: parse, call
`gpuplane.batch.cache`, print.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpuplane.batch.cache import Entry, StageCache, human_size, parse_age, parse_size, plan_gc
from gpuplane.batch.errors import BatchError
from gpuplane.batch.pipeline import load_pipeline
from gpuplane.batch.summary import used_versions
from gpuplane.cli._batch_common import (
    CACHE_OPTION,
    CONFIG_OPTION,
    OUTPUT_OPTION,
    BatchOutput,
    batch_settings,
    emit,
    guard,
    key_help,
    stdout,
)

app = typer.Typer(help="Inspect and trim the stage cache.")


def _store(config: Path | None, cache: str | None) -> StageCache:
    return StageCache(batch_settings(config, cache_url=cache).cache_url)


def _entries(config: Path | None, cache: str | None) -> list[Entry]:
    return guard(lambda: list(_store(config, cache).entries()))


@app.command("ls")
def cache_ls(
    cache: str | None = CACHE_OPTION,
    stage: str | None = typer.Option(None, help="only this stage"),
    config: Path | None = CONFIG_OPTION,
    output: BatchOutput = OUTPUT_OPTION,
) -> None:
    """List cache entries."""
    entries = [e for e in _entries(config, cache) if stage in (None, e.stage)]
    if output is not BatchOutput.table:
        emit([dataclasses.asdict(e) for e in entries], output)
        return
    t = Table()
    for col in ("stage", "version", "key", "size", "age"):
        t.add_column(col)
    now = time.time()
    for e in sorted(entries, key=lambda e: (e.stage, e.version or "", e.key)):
        t.add_row(e.stage, _version(e), e.key[:16], human_size(e.size), f"{now - e.mtime:.0f} s")
    stdout().print(t)


def _version(e: Entry) -> str:
    return "-" if e.version is None else e.version  # None: a temp file or an unversioned entry


@app.command("du")
def cache_du(
    cache: str | None = CACHE_OPTION,
    config: Path | None = CONFIG_OPTION,
    output: BatchOutput = OUTPUT_OPTION,
) -> None:
    """Entries and bytes per stage and per stage version."""
    usage: dict[str, dict[str, Any]] = {}
    for e in _entries(config, cache):
        u = usage.setdefault(e.stage, {"entries": 0, "bytes": 0, "versions": {}})
        v = u["versions"].setdefault(e.version, {"entries": 0, "bytes": 0})
        for counts in (u, v):
            counts["entries"] += 1
            counts["bytes"] += e.size
    if output is not BatchOutput.table:
        emit(usage, output)
        return
    t = Table()
    for col in ("stage", "version", "entries", "size"):
        t.add_column(col)
    for name, u in sorted(usage.items()):
        for version, v in sorted(u["versions"].items(), key=lambda kv: kv[0] or ""):
            t.add_row(name, "-" if version is None else version, str(v["entries"]),
                      human_size(v["bytes"]))  # fmt: skip
    t.add_row("total", "", str(sum(u["entries"] for u in usage.values())),
              human_size(sum(u["bytes"] for u in usage.values())))  # fmt: skip
    stdout().print(t)


@app.command("gc")
def cache_gc(
    cache: str | None = CACHE_OPTION,
    max_age: str | None = typer.Option(None, help="drop entries older than this (30m, 12h, 7d)"),
    max_size: str | None = typer.Option(None, help="then drop the oldest until under (10G)"),
    superseded: bool = typer.Option(
        False, help="drop stage versions that no run under the runs dir (nor --pipeline) used"
    ),
    runs_dir: str | None = typer.Option(None, help=key_help("runs_dir")),
    pipeline: str | None = typer.Option(
        None, help="with --superseded: this pipeline's stage versions are kept too"
    ),
    dry_run: bool = typer.Option(False, help="say what would go, remove nothing"),
    config: Path | None = CONFIG_OPTION,
    output: BatchOutput = OUTPUT_OPTION,
) -> None:
    """Evict entries of superseded stage versions. By age and by total size (oldest first)."""

    def go() -> dict[str, Any]:
        if not superseded and max_age is None and max_size is None:
            raise BatchError("say what to evict: --superseded, --max-age 7d and/or --max-size 10G")
        cfg = batch_settings(config, cache_url=cache, runs_dir=runs_dir)
        used = used_versions(Path(cfg.runs_dir)) if superseded else None
        if used is not None and pipeline is not None:
            for s in load_pipeline(pipeline).stages:
                used.setdefault(s.name, set()).add(s.version)
        store = StageCache(cfg.cache_url)
        gc = plan_gc(
            list(store.entries()),
            time.time(),
            parse_age(max_age) if max_age else None,
            parse_size(max_size) if max_size else None,
            used=used,
        )
        if not dry_run:
            for e in gc.remove:
                store.remove(e)
        return {"removed": len(gc.remove), "freed_bytes": gc.freed_bytes,
                "kept_bytes": gc.keep_bytes, "dry_run": dry_run}  # fmt: skip

    doc = guard(go)
    if output is not BatchOutput.table:
        emit(doc, output)
    else:
        verb = "would remove" if dry_run else "removed"
        typer.echo(
            f"{verb} {doc['removed']} entries ({human_size(doc['freed_bytes'])}); "
            f"{human_size(doc['kept_bytes'])} kept"
        )
