"""The stage cache: atomic writes, digest-checked reads, concurrent writers, gc, and its CLI."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.batch.cache import Entry, StageCache, human_size, parse_age, parse_size, plan_gc
from gpuplane.batch.errors import BatchError
from gpuplane.cli.batch import app
from tests.helpers.batch import TOY


def test_put_get_roundtrip_and_stats(tmp_path: Path) -> None:
    c = StageCache(str(tmp_path / "c"))
    assert c.get("a", "1", "k1") == (False, None)
    n = c.put("a", "1", "k1", {"x": [1, 2, 3]})
    assert c.get("a", "1", "k1") == (True, {"x": [1, 2, 3]})
    st = c.stats.of("a")
    assert (st.hits, st.misses, st.writes, st.bytes_written) == (1, 1, 1, n)
    assert [p.name for p in (tmp_path / "c").rglob("*") if p.is_file()] == ["k1.gpc"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_entry_is_a_miss_and_is_removed(tmp_path: Path, damage: str) -> None:
    c = StageCache(str(tmp_path))
    c.put("a", "1", "abcd", list(range(100)))
    path = Path(c.path("a", "1", "abcd"))
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-3] ^= 0xFF
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob = bytearray(b"not an entry")
    path.write_bytes(bytes(blob))
    assert c.get("a", "1", "abcd") == (False, None)
    assert not path.exists()
    assert c.stats.of("a").corrupt == 1


def _hammer(root: str, seconds: float) -> int:
    c = StageCache(root)
    value = {"payload": list(range(20_000))}
    end = time.time() + seconds
    bad = 0
    while time.time() < end:
        c.put("a", "1", "samekey", value)
        hit, got = c.get("a", "1", "samekey")
        if hit and got != value:
            bad += 1
    return bad


def test_concurrent_writers_of_one_key_never_expose_a_partial_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        bad = pool.starmap(_hammer, [(str(tmp_path), 1.5)] * 3)
    c = StageCache(str(tmp_path))
    assert sum(bad) == 0
    assert c.get("a", "1", "samekey")[0]
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
        c.put("perception", "1", f"{i:02d}" * 8, b"x" * 1000)
    c.put("check", "1", "ff" * 8, b"y")
    old = Path(c.path("perception", "1", "00" * 8))
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
    c.put("a", "1", "k" * 8, [1, 2])
    assert c.get("a", "1", "k" * 8) == (True, [1, 2])
    assert [e.stage for e in c.entries()] == ["a"]
    c.remove(next(iter(c.entries())))
    assert c.get("a", "1", "k" * 8) == (False, None)


def table_rows(output: str) -> list[list[str]]:
    """The body rows of a Rich table as printed (cells between its │ rules)."""
    return [[c.strip() for c in line.strip().strip("│").split("│")]
            for line in output.splitlines() if line.count("│") > 2]  # fmt: skip


def test_human_size_reads_as_parse_size_writes() -> None:
    assert [human_size(n) for n in (512, 1536, 20 << 20, 3 << 30, 5 << 40)] == [
        "512 B", "1.5 KiB", "20.0 MiB", "3.0 GiB", "5120.0 GiB"]  # fmt: skip
    assert parse_size("1.5 KiB".replace(" ", "")) == 1536


def test_cache_ls_and_du_show_each_stage_version_and_human_sizes(tmp_path: Path) -> None:
    c = StageCache(str(tmp_path))
    c.put("perception", "1", "aa" * 8, b"x" * 3000)
    c.put("perception", "2", "bb" * 8, b"x" * 3000)
    c.put("perception", "2", "cc" * 8, b"x" * 3000)
    cli = CliRunner()
    ls = cli.invoke(app, ["cache", "ls", "--cache", str(tmp_path)])
    assert ls.exit_code == 0, ls.output
    assert ls.output.split("\n")[1].split() == ["┃", "stage", "┃", "version", "┃", "key", "┃",
                                               "size", "┃", "age", "┃"]  # fmt: skip
    assert [r[:2] + r[3:4] for r in table_rows(ls.output)] == [
        ["perception", "1", "3.0 KiB"], ["perception", "2", "3.0 KiB"],
        ["perception", "2", "3.0 KiB"]]  # fmt: skip
    du = cli.invoke(app, ["cache", "du", "--cache", str(tmp_path)])
    assert table_rows(du.output) == [["perception", "1", "1", "3.0 KiB"],
                                     ["perception", "2", "2", "6.0 KiB"],
                                     ["total", "", "3", "8.9 KiB"]]  # fmt: skip
    as_json = cli.invoke(app, ["cache", "du", "--cache", str(tmp_path), "-o", "json"])
    doc = json.loads(as_json.output)
    assert doc["perception"]["versions"]["2"]["entries"] == 2


def test_gc_superseded_drops_the_versions_no_run_used(tmp_path: Path) -> None:
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    c = StageCache(str(cache))
    for stage, version, key in [("perception", "1", "a1"), ("perception", "2", "a2"),
                                ("perception", "3", "a3"), ("size_check", "1", "b1"),
                                ("lonely", "1", "c1")]:  # fmt: skip
        c.put(stage, version, key * 8, [stage, version])
    unversioned = cache / "size_check" / "b0" / f"{'b0' * 8}.gpc"  # the layout before versions
    unversioned.parent.mkdir(parents=True)
    unversioned.write_bytes(b"old")
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "run.json").write_text(
        json.dumps({"versions": {"perception": "2", "size_check": "1"}})
    )
    common = ["cache", "gc", "--cache", str(cache), "--runs-dir", str(runs), "--superseded"]
    cli = CliRunner()
    dry = cli.invoke(app, [*common, "--dry-run", "-o", "json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["removed"] == 3  # perception 1 and 3, the unversioned one
    assert len(list(c.entries())) == 6  # a dry run removes nothing
    # the pipeline about to run keeps its versions too (the toy's perception is version 1)
    gc = cli.invoke(app, [*common, "--pipeline", TOY])
    assert gc.exit_code == 0, gc.output
    assert gc.output.startswith("removed 2 entries")
    assert sorted((e.stage, e.version) for e in c.entries()) == [
        ("lonely", "1"), ("perception", "1"), ("perception", "2"), ("size_check", "1")]  # fmt: skip
    (runs / "r2").mkdir()
    (runs / "r2" / "run.json").write_text("{torn")
    bad = cli.invoke(app, [*common])
    assert bad.exit_code == 2
    assert f"cannot read {runs / 'r2' / 'run.json'}" in " ".join(bad.output.split())
    assert len(list(c.entries())) == 4
