"""The stage cache: atomic writes, digest-checked reads, concurrent writers, gc, and its CLI."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.batch.cache import Entry, StageCache, parse_age, parse_size, plan_gc
from gpuplane.batch.errors import BatchError
from gpuplane.cli.batch import app


def test_put_get_roundtrip_and_stats(tmp_path: Path) -> None:
    c = StageCache(str(tmp_path / "c"))
    assert c.get("a", "k1") == (False, None)
    n = c.put("a", "k1", {"x": [1, 2, 3]})
    assert c.get("a", "k1") == (True, {"x": [1, 2, 3]})
    st = c.stats.of("a")
    assert (st.hits, st.misses, st.writes, st.bytes_written) == (1, 1, 1, n)
    assert [p.name for p in (tmp_path / "c").rglob("*") if p.is_file()] == ["k1.gpc"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_entry_is_a_miss_and_is_removed(tmp_path: Path, damage: str) -> None:
    c = StageCache(str(tmp_path))
    c.put("a", "abcd", list(range(100)))
    path = Path(c.path("a", "abcd"))
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-3] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob = bytearray(b"not an entry")
    path.write_bytes(bytes(blob))
    assert c.get("a", "abcd") == (False, None)
    assert not path.exists()
    assert c.stats.of("a").corrupt == 1


def _hammer(root: str, seconds: float) -> int:
    c = StageCache(root)
    value = {"payload": list(range(20_000))}
    end = time.time() + seconds
    bad = 0
    while time.time() < end:
        c.put("a", "samekey", value)
        hit, got = c.get("a", "samekey")
        if hit and got != value:
            bad += 1
    return bad


def test_concurrent_writers_of_one_key_never_expose_a_partial_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        bad = pool.starmap(_hammer, [(str(tmp_path), 1.5)] * 3)
    c = StageCache(str(tmp_path))
    assert sum(bad) == 0
    assert c.get("a", "samekey")[0]
    assert c.stats.of("a").corrupt == 0
    assert not [p for p in tmp_path.rglob("*.tmp-*")]


def test_gc_plan_by_age_then_size() -> None:
    now = 10_000.0
    es = [Entry("a", f"k{i}", f"/c/a/k{i}", 100, now - i * 100) for i in range(10)]
    tmp_old = Entry("<tmp>", "x.tmp-1", "/c/a/x.tmp-1", 50, now - 7200)
    tmp_new = Entry("<tmp>", "y.tmp-2", "/c/a/y.tmp-2", 50, now - 10)
    by_age = plan_gc([*es, tmp_old, tmp_new], now, max_age_s=450)
    assert {e.key for e in by_age.remove} == {"k5", "k6", "k7", "k8", "k9", "x.tmp-1"}
    by_size = plan_gc(es, now, max_bytes=300)
    assert {e.key for e in by_size.remove} == {f"k{i}" for i in range(3, 10)}
    assert by_size.keep_bytes == 300
    assert by_size.freed_bytes == 700
    with pytest.raises(BatchError):
        plan_gc(es, now, max_age_s=-1)


def test_parse_size_and_age() -> None:
    assert parse_size("2K") == 2048
    assert parse_size("1.5G") == int(1.5 * (1 << 30))
    assert parse_size("10MiB") == 10 << 20
    assert parse_size("77") == 77
    assert parse_age("15m") == 900
    assert parse_age("2d") == 172_800
    with pytest.raises(BatchError, match="500M"):
        parse_size("lots")
    with pytest.raises(BatchError, match="7d"):
        parse_age("soon")


def test_cache_cli_ls_du_gc(tmp_path: Path) -> None:
    c = StageCache(str(tmp_path))
    for i in range(4):
        c.put("perception", f"{i:02d}" * 8, b"x" * 1000)
    c.put("check", "ff" * 8, b"y")
    old = Path(c.path("perception", "00" * 8))
    os.utime(old, (time.time() - 86_400 * 3, time.time() - 86_400 * 3))
    cli = CliRunner()
    ls = cli.invoke(app, ["cache", "ls", "--cache", str(tmp_path), "-o", "json"])
    assert ls.exit_code == 0, ls.output
    assert ls.output.count('"stage": "perception"') == 4
    du = cli.invoke(app, ["cache", "du", "--cache", str(tmp_path), "-o", "json"])
    assert '"entries": 4' in du.output
    assert '"entries": 1' in du.output
    dry = cli.invoke(app, ["cache", "gc", "--cache", str(tmp_path), "--max-age", "2d", "--dry-run"])
    assert dry.exit_code == 0
    assert "would remove 1" in dry.output
    assert old.exists()
    gc = cli.invoke(app, ["cache", "gc", "--cache", str(tmp_path), "--max-age", "2d"])
    assert "removed 1" in gc.output
    assert not old.exists()
    none = cli.invoke(app, ["cache", "gc", "--cache", str(tmp_path)])
    assert none.exit_code == 2
    assert "--max-age" in none.output


def test_any_fsspec_url_works_as_cache_root() -> None:
    c = StageCache("memory://gpuplane-test-cache")
    c.put("a", "k" * 8, [1, 2])
    assert c.get("a", "k" * 8) == (True, [1, 2])
    assert [e.stage for e in c.entries()] == ["a"]
    c.remove(next(iter(c.entries())))
    assert c.get("a", "k" * 8) == (False, None)
