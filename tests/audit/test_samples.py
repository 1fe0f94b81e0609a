"""The sample schema, its validation and the day-partitioned Parquet store."""

from __future__ import annotations

import importlib.util
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpuplane.audit.sample_store import SampleStore
from gpuplane.audit.samples import (
    SAMPLE_SCHEMA,
    SampleError,
    Traffic,
    coerce,
    to_table,
    validate,
)
from tests.audit.audit_helpers import SAMPLE_T0, sample


def test_rows_round_trip_through_the_store_across_days(tmp_path: Path) -> None:
    store = SampleStore(tmp_path)
    rows = [sample(m, mem_used_mib=float(m)) for m in range(5)]  # 23:58 .. 00:02 next day
    written = store.append(to_table(rows))
    assert sorted(p.parent.name for p in written) == ["day=2026-12-01", "day=2026-12-02"]
    back = store.scan()
    assert back.schema == SAMPLE_SCHEMA
    assert sorted(back.column("mem_used_mib").to_pylist()) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert back.column("team").to_pylist() == ["vision"] * 5


def test_scan_selects_time_range_columns_and_filter(tmp_path: Path) -> None:
    store = SampleStore(tmp_path)
    store.append(to_table([sample(m, team="vision" if m % 2 else "nlp") for m in range(6)]))
    since, until = SAMPLE_T0 + timedelta(minutes=1), SAMPLE_T0 + timedelta(minutes=4)
    got = store.scan(since=since, until=until, columns=["time", "team"])
    assert got.column_names == ["time", "team"]
    assert got.column("time").to_pylist() == [SAMPLE_T0 + timedelta(minutes=m) for m in (1, 2, 3)]
    vision = store.scan(filter=pc.field("team") == "vision")
    assert vision.num_rows == 3
    with pytest.raises(SampleError, match=r"unknown column.*teem.*valid: time"):
        store.scan(columns=["teem"])


def test_unknown_usage_is_null(tmp_path: Path) -> None:
    store = SampleStore(tmp_path)
    store.append(to_table([sample(mem_used_mib=None, compute_share=None, alloc_mem_mib=None)]))
    row = store.scan().to_pylist()[0]
    assert (row["mem_used_mib"], row["compute_share"], row["alloc_mem_mib"]) == (None, None, None)


@pytest.mark.parametrize(
    ("over", "column", "why"),
    [
        ({"compute_share": 1.5}, "compute_share", "within 0..1"),
        ({"compute_share": -0.1}, "compute_share", "within 0..1"),
        ({"mem_used_mib": 90000.0}, "mem_used_mib", "within 0..card_mem_mib"),
        ({"alloc_mem_mib": 90000}, "alloc_mem_mib", "within 0..card_mem_mib"),
        ({"alloc_cores_pct": 101}, "alloc_cores_pct", "within 0..100"),
        ({"card_mem_mib": 0, "alloc_mem_mib": 0}, "card_mem_mib", "> 0"),
        ({"kind": "training"}, "kind", "'inference', 'batch'"),
    ],
)
def test_out_of_range_values_name_their_column_and_first_row(
    over: dict[str, Any], column: str, why: str
) -> None:
    rows = [sample(0), sample(1), sample(2, **over), sample(3, **over)]
    with pytest.raises(SampleError, match=f"column '{column}' row 2: .*{why}") as err:
        to_table(rows)
    assert (err.value.column, err.value.row) == (column, 2)


def test_missing_or_mistyped_columns_are_refused() -> None:
    table = to_table([sample()])
    with pytest.raises(SampleError, match="missing column 'compute_share'"):
        validate(table.drop_columns(["compute_share"]))
    mistyped = table.set_column(
        table.schema.get_field_index("card_mem_mib"),
        "card_mem_mib",
        table.column("card_mem_mib").cast(pa.int64()),
    )
    with pytest.raises(SampleError, match="column 'card_mem_mib' is int64, expected int32"):
        validate(mistyped)
    nulls = table.set_column(
        table.schema.get_field_index("node"), "node", pa.array([None], pa.string())
    )
    with pytest.raises(SampleError, match="column 'node' row 0: is empty"):
        validate(coerce(nulls))


def test_coerce_reads_foreign_types_nan_as_null_and_names_a_bad_value() -> None:
    foreign = to_table([sample(), sample(1)]).to_pydict()
    foreign["time"] = ["2026-12-01T10:00:00Z", "2026-12-01 11:00:00"]  # zoned and naive (UTC)
    foreign["mem_used_mib"] = [float("nan"), 5.0]
    table = coerce(pa.table(foreign))
    validate(table)
    assert table.column("time").to_pylist() == [
        datetime(2026, 12, 1, 10, tzinfo=UTC),
        datetime(2026, 12, 1, 11, tzinfo=UTC),
    ]
    assert table.column("mem_used_mib").to_pylist() == [None, 5.0]
    foreign["card_mem_mib"] = ["81920", "lots"]
    with pytest.raises(SampleError, match="column 'card_mem_mib' row 1: cannot read 'lots'"):
        coerce(pa.table(foreign))


def test_a_refused_batch_writes_nothing(tmp_path: Path) -> None:
    store = SampleStore(tmp_path)
    store.append(to_table([sample()]))
    bad = to_table([sample()]).to_pydict()
    bad["compute_share"] = [3.0]
    with pytest.raises(SampleError):
        store.append(coerce(pa.table(bad)))
    assert store.scan().num_rows == 1


def test_a_killed_writer_leaves_only_a_hidden_temp_file_that_scans_skip(tmp_path: Path) -> None:
    store = SampleStore(tmp_path)
    [part] = store.append(to_table([sample()]))
    (part.parent / ".part-killed.tmp").write_bytes(part.read_bytes()[:100])  # torn write
    assert store.scan().num_rows == 1


def test_compaction_merges_parts_sorted_and_never_counts_a_row_twice(tmp_path: Path) -> None:
    store = SampleStore(tmp_path)
    for m in (-3, -5, -4):
        store.append(to_table([sample(m, card="GPU-b"), sample(m, card="GPU-a")]))
    [day] = store.days()
    parts = store.parts(day)
    saved = tmp_path / "saved"
    saved.mkdir()
    for p in parts:
        shutil.copy(p, saved / p.name)
    merged = store.compact(day)
    assert merged is not None
    assert store.parts(day) == [merged]
    back = store.scan()
    cards = back.column("card").to_pylist()
    assert len(set(cards[:3])) == 1  # grouped by card
    assert sorted(cards) == ["GPU-a"] * 3 + ["GPU-b"] * 3
    times = [SAMPLE_T0 + timedelta(minutes=m) for m in (-5, -4, -3)]
    assert back.column("time").to_pylist() == times * 2  # each card's rows in time order
    # a crash after the merged file landed but before its parts were deleted
    for p in saved.iterdir():
        shutil.copy(p, merged.parent / p.name)
    assert store.scan().num_rows == 6
    assert store.compact(day) == merged  # idempotent: the stale parts are dropped
    assert sorted(merged.parent.iterdir()) == [merged]
    assert store.scan().num_rows == 6


def test_traffic_rows_have_their_own_schema(tmp_path: Path) -> None:
    store = SampleStore(tmp_path / "traffic", schema=to_table([traffic()]).schema)
    store.append(to_table([traffic(), traffic(requests=0)]))
    assert store.scan(columns=["requests"]).column(0).to_pylist() == [3, 0]
    with pytest.raises(SampleError, match="column 'requests' row 0: is negative"):
        to_table([traffic(requests=-1)])


def traffic(**over: Any) -> Traffic:
    base: dict[str, Any] = {
        "time": SAMPLE_T0,
        "model": "chat",
        "instance": "http://127.0.0.1:9001",
        "requests": 3,
        "prompt_tokens": 30,
        "completion_tokens": 12,
        "slot_seconds": 4.5,
    }
    return Traffic(**(base | over))


def bench_fleet(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The benchmark's fleet generator (benchmarks/audit_store.py), loaded from its file."""
    bench = Path(__file__).parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    spec = importlib.util.spec_from_file_location("audit_store", bench / "audit_store.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fleet


@pytest.mark.slow
def test_ten_thousand_cards_for_three_hours_store_compactly_and_scan_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = bench_fleet(monkeypatch)
    cards, minutes = 10_000, 180
    store = SampleStore(tmp_path)
    start = datetime(2026, 12, 1, 6, tzinfo=UTC)
    for hour in range(3):  # as a collector writes: a batch per pass
        store.append(fleet(cards, minutes // 3, start + timedelta(hours=hour), seed=hour))
    [day] = store.days()
    store.compact(day)
    rows = cards * minutes
    size = sum(p.stat().st_size for p in store.parts(day))
    # measured ~3.6 bytes per sample compacted (its card names' dictionary is a quarter of it over
    # only three hours); row-wise storage would be ~60
    assert size / rows < 6
    back = store.scan(columns=["card", "compute_share"])
    assert back.num_rows == rows
    one = store.scan(
        since=start + timedelta(hours=1),
        until=start + timedelta(hours=2),
        filter=pc.field("card") == "GPU-00000007-0000-0000-0000-000000000007",
    )
    assert one.num_rows == 60
