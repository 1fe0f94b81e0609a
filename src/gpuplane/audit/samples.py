"""The audit's two tables (usage samples, gateway traffic), their validation, and their store.

A **sample** is one workload on one card at one time: what it was allocated and what it used.
A card with nothing allocated is one sample with `workload = ""`. Every collector writes this one
schema; the findings, recommendations and plan read only it.

| column | type | meaning |
|---|---|---|
| `time` | timestamp[s, UTC] | when the sample was taken (end of the interval it covers) |
| `cluster`, `node` | dictionary<int32, string> | where the card is |
| `card` | dictionary<int32, string> | the card's UUID, or `"<node>/<index>"` when none is known |
| `gpu_model` | dictionary<int32, string> | e.g. `"A100-80GB"`; `""` unknown |
| `workload` | dictionary<int32, string> | job id or deployment/instance id; `""` = unallocated |
| `team` | dictionary<int32, string> | the workload's team; `""` unknown |
| `kind` | dictionary<int32, string> | `"inference"`, `"batch"` or `""` unknown |
| `card_mem_mib` | int32 | the card's memory, MiB (> 0) |
| `alloc_mem_mib` | int32, null = unknown | the slice's memory, MiB; whole card = `card_mem_mib` |
| `alloc_cores_pct` | int16, null = unknown | the slice's share of the card's cores, 0..100 |
| `mem_used_mib` | float32, null = unknown | memory the workload held, MiB, 0..`card_mem_mib` |
| `compute_share` | float32, null = unknown | share of the *whole card's* compute it used, 0..1 |

Unknown is null, never NaN or -1: `coerce` turns NaN into null on the way in.

The store is a directory of Parquet files, one folder per UTC day (`day=YYYY-MM-DD/`). Writes are
append-only: each batch goes to a hidden temporary file that is fsynced and renamed into place, so
a killed collector loses at most the batch in flight and a reader never sees half a file.
`compact(day)` merges a day's parts into one file grouped by card in time order (the compact
form scans fastest); the merged file names the parts it replaces in its footer, so a crash between
writing it and deleting them never counts a row twice. Stored this way a sample costs about
2.9 bytes (10,000 cards x 1-minute samples for a day: `benchmarks/audit_store.py`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gpuplane.errors import GpuplaneError

KINDS = ("inference", "batch", "")
# text columns where "" is a value (unknown, or nothing allocated): coerce reads null as ""
BLANK_TEXT = ("gpu_model", "workload", "team", "kind")

_STR = pa.dictionary(pa.int32(), pa.string())
_TIME = pa.timestamp("s", tz="UTC")

SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("time", _TIME, nullable=False),
        pa.field("cluster", _STR, nullable=False),
        pa.field("node", _STR, nullable=False),
        pa.field("card", _STR, nullable=False),
        pa.field("gpu_model", _STR, nullable=False),
        pa.field("workload", _STR, nullable=False),
        pa.field("team", _STR, nullable=False),
        pa.field("kind", _STR, nullable=False),
        pa.field("card_mem_mib", pa.int32(), nullable=False),
        pa.field("alloc_mem_mib", pa.int32()),
        pa.field("alloc_cores_pct", pa.int16()),
        pa.field("mem_used_mib", pa.float32()),
        pa.field("compute_share", pa.float32()),
    ]
)

# One row per (model, instance) per collection interval: what the gateway served in it.
TRAFFIC_SCHEMA = pa.schema(
    [
        pa.field("time", _TIME, nullable=False),
        pa.field("model", _STR, nullable=False),  # the model a deployment serves
        pa.field("instance", _STR, nullable=False),  # the instance's URL
        pa.field("requests", pa.int64(), nullable=False),  # finished in the interval
        pa.field("prompt_tokens", pa.int64()),  # null: the engine does not count them
        pa.field("completion_tokens", pa.int64()),
        pa.field("slot_seconds", pa.float64(), nullable=False),  # slots held x seconds
    ]
)


class SampleError(GpuplaneError):
    """A table of samples does not fit the schema: the message names the column and row (the
    0-based row of the table; `row` is None when the whole column is wrong)."""

    def __init__(self, message: str, column: str | None = None, row: int | None = None) -> None:
        super().__init__(message)
        self.column = column
        self.row = row


@dataclass(frozen=True, slots=True)
class Sample:
    """One workload on one card at one time (a row of `SAMPLE_SCHEMA`)."""

    time: datetime
    cluster: str
    node: str
    card: str
    card_mem_mib: int
    gpu_model: str = ""
    workload: str = ""
    team: str = ""
    kind: str = ""
    alloc_mem_mib: int | None = None
    alloc_cores_pct: int | None = None
    mem_used_mib: float | None = None
    compute_share: float | None = None


@dataclass(frozen=True, slots=True)
class Traffic:
    """What one instance of a model served in one interval (a row of `TRAFFIC_SCHEMA`)."""

    time: datetime
    model: str
    instance: str
    requests: int
    prompt_tokens: int | None
    completion_tokens: int | None
    slot_seconds: float


def to_table(rows: Sequence[Sample] | Sequence[Traffic]) -> pa.Table:
    """Rows as a validated table of their schema (samples, or traffic)."""
    schema = TRAFFIC_SCHEMA if rows and isinstance(rows[0], Traffic) else SAMPLE_SCHEMA
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for row in rows:
        for name, value in asdict(row).items():
            columns[name].append(value)
    table = coerce(
        pa.table({n: pa.array(v) if v else pa.array([], pa.null()) for n, v in columns.items()}),
        schema,
    )
    validate(table)
    return table


def coerce(table: pa.Table, schema: pa.Schema = SAMPLE_SCHEMA) -> pa.Table:
    """`table` cast to `schema` (column order, types; NaN and empty numbers → null; empty
    `BLANK_TEXT` → ""; naive times read as UTC). A missing column or a value that cannot be
    cast is a `SampleError` naming it."""
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise SampleError(
            f"missing column(s) {', '.join(missing)}; a sample table has the columns "
            f"{', '.join(schema.names)}",
            missing[0],
        )
    arrays = []
    for field in schema:
        column = table.column(field.name)
        if field.name in BLANK_TEXT and column.null_count:
            column = pc.fill_null(column.cast(pa.string()), "")
        try:
            arrays.append(_convert(column, field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            row = _first_unconvertible(column, field.type)
            raise SampleError(
                f"column '{field.name}'"
                + (f" row {row}: cannot read {column[row].as_py()!r}" if row is not None else "")
                + f" as {field.type} ({exc})",
                field.name,
                row,
            ) from None
    return pa.Table.from_arrays(arrays, schema=schema)


_ZONE = r"(Z|[+-]\d\d:?\d\d)$"


def _convert(column: pa.ChunkedArray | pa.Array, to: pa.DataType) -> pa.ChunkedArray | pa.Array:
    if pa.types.is_floating(column.type):
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
    if pa.types.is_timestamp(to):
        if pa.types.is_string(column.type):
            # ISO 8601 text: with its zone offset where given, else read as UTC
            zoned = pc.match_substring_regex(column, _ZONE)
            column = pc.if_else(
                zoned,
                pc.if_else(zoned, column, None).cast(_TIME),
                pc.assume_timezone(pc.if_else(zoned, None, column).cast(pa.timestamp("s")), "UTC"),
            )
        elif pa.types.is_timestamp(column.type) and column.type.tz is None:
            column = pc.assume_timezone(column, "UTC")
        return column.cast(to, safe=False)  # sub-second digits are dropped
    if pa.types.is_dictionary(to) and pa.types.is_null(column.type):
        column = column.cast(pa.string())
    return column.cast(to)


def _first_unconvertible(column: pa.ChunkedArray, to: pa.DataType) -> int | None:
    for i, value in enumerate(column):
        try:
            _convert(pa.array([value.as_py()], column.type), to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return i
    return None


def validate(table: pa.Table) -> None:
    """Refuse a table whose columns are missing or mistyped, or whose values are out of range;
    the message names the column and its first bad row. Samples or traffic, by its columns."""
    schema = TRAFFIC_SCHEMA if "instance" in table.column_names else SAMPLE_SCHEMA
    for field in schema:
        if field.name not in table.column_names:
            raise SampleError(f"missing column '{field.name}' (type {field.type})", field.name)
        actual = table.schema.field(field.name).type
        if actual != field.type:
            raise SampleError(
                f"column '{field.name}' is {actual}, expected {field.type}; "
                "read foreign tables through coerce()",
                field.name,
            )
        column = table.column(field.name)
        if not field.nullable:
            _refuse(field.name, pc.is_null(column), "is empty; this column is required")
        if pa.types.is_floating(field.type):
            _refuse(field.name, pc.is_nan(column), "is NaN; write null for unknown")
    for name, bad, why in _range_checks(table, schema):
        _refuse(name, bad, why)


def _range_checks(table: pa.Table, schema: pa.Schema) -> Iterable[tuple[str, Any, str]]:
    col = table.column
    if schema is TRAFFIC_SCHEMA:
        for name in ("requests", "prompt_tokens", "completion_tokens", "slot_seconds"):
            yield name, pc.less(col(name), 0), "is negative"
        return
    card = col("card_mem_mib")
    yield (
        "kind",
        pc.invert(pc.is_in(col("kind").cast(pa.string()), pa.array(KINDS))),
        ("is not one of 'inference', 'batch' or '' (unknown)"),
    )
    yield "card_mem_mib", pc.less_equal(card, 0), "must be > 0"
    yield (
        "alloc_mem_mib",
        pc.or_(pc.less(col("alloc_mem_mib"), 0), pc.greater(col("alloc_mem_mib"), card)),
        "must be within 0..card_mem_mib",
    )
    yield (
        "alloc_cores_pct",
        pc.or_(pc.less(col("alloc_cores_pct"), 0), pc.greater(col("alloc_cores_pct"), 100)),
        "must be within 0..100",
    )
    used = col("mem_used_mib")
    yield (
        "mem_used_mib",
        pc.or_(pc.less(used, 0), pc.greater(used, card.cast(pa.float32()))),
        ("must be within 0..card_mem_mib"),
    )
    share = col("compute_share")
    yield "compute_share", pc.or_(pc.less(share, 0), pc.greater(share, 1)), "must be within 0..1"


def _refuse(name: str, bad: Any, why: str) -> None:
    """Raise for the first row where `bad` is true (null counts as fine)."""
    mask = pc.fill_null(bad, False)
    if not pc.any(mask).as_py():
        return
    row = pc.index(mask, True).as_py()
    raise SampleError(f"column '{name}' row {row}: {why}", name, row)


class SampleStore:
    """A directory of Parquet files by UTC day: append a validated table, scan a time range.

    `append` and `compact` are the only writers; several readers may scan at any time."""

    def __init__(self, root: Path | str, schema: pa.Schema = SAMPLE_SCHEMA) -> None:
        self.root = Path(root)
        self.schema = schema

    def append(self, table: pa.Table) -> list[Path]:
        """Write `table` (validated first; nothing is written if it is refused) as one new part
        per day it covers; returns the parts written."""
        validate(table)
        if table.num_rows == 0:
            return []
        days = pc.strftime(table.column("time"), format="%Y-%m-%d")
        written = []
        for day in pc.unique(days).to_pylist():
            part = table.filter(pc.equal(days, day))
            written.append(self._write(self.root / f"day={day}", f"part-{uuid.uuid4().hex}", part))
        return written

    def _write(
        self, folder: Path, stem: str, table: pa.Table, replaces: Sequence[str] = ()
    ) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{stem}.tmp"
        final = folder / f"{stem}.parquet"
        metadata = {b"gpuplane.replaces": json.dumps(list(replaces)).encode()}
        with pq.ParquetWriter(
            tmp, table.schema.with_metadata(metadata), compression="zstd", use_dictionary=True
        ) as writer:
            writer.write_table(table, row_group_size=1 << 22)  # fewer copies of the dictionaries
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(folder)
        return final

    def days(self) -> list[date]:
        """The days the store holds samples for, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(
            date.fromisoformat(p.name.removeprefix("day="))
            for p in self.root.glob("day=*")
            if p.is_dir()
        )

    def parts(self, day: date) -> list[Path]:
        """The live Parquet files of one day: a part that a merged file replaced is left out."""
        folder = self.root / f"day={day.isoformat()}"
        files = sorted(folder.glob("*.parquet"))
        replaced: set[str] = set()
        for path in files:
            if path.name.startswith("merged-"):
                raw = (pq.read_schema(path).metadata or {}).get(b"gpuplane.replaces", b"[]")
                replaced.update(json.loads(raw))
        return [p for p in files if p.name not in replaced]

    def compact(self, day: date) -> Path | None:
        """Merge one day's parts into one file, grouped by card (workload) in time order, then
        delete the parts.
        Idempotent; a crash at any point leaves every row counted once."""
        parts = self.parts(day)
        if len(parts) <= 1:
            self._drop_replaced(day)
            return parts[0] if parts else None
        table = ds.dataset(parts, schema=self.schema, format="parquet").to_table()
        table = table.unify_dictionaries().combine_chunks()
        # Arrow sorts tables by plain columns only: a text key sorts by its dictionary index,
        # which groups a card's rows (what compresses) without comparing strings
        keys = pa.table({k: _plain(table.column(k)) for k in self._sort_keys()})
        order = pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in keys.column_names])
        merged = self._write(
            self.root / f"day={day.isoformat()}",
            f"merged-{uuid.uuid4().hex}",
            table.take(order),
            replaces=[p.name for p in parts],
        )
        self._drop_replaced(day)
        return merged

    def _sort_keys(self) -> tuple[str, ...]:
        return (
            ("instance", "time") if self.schema is TRAFFIC_SCHEMA else ("card", "workload", "time")
        )

    def _drop_replaced(self, day: date) -> None:
        folder = self.root / f"day={day.isoformat()}"
        live = set(self.parts(day))
        for path in folder.glob("*.parquet"):
            if path not in live:
                path.unlink(missing_ok=True)

    def scan(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
    ) -> pa.Table:
        """Samples with `since <= time < until` (either bound may be open), only `columns` (all
        by default), matching `filter` (a `pyarrow.dataset` expression, e.g.
        `pc.field("team") == "vision"`)."""
        unknown = [c for c in columns or () if c not in self.schema.names]
        if unknown:
            raise SampleError(
                f"unknown column(s) {', '.join(unknown)}; valid: {', '.join(self.schema.names)}"
            )
        lo = since.astimezone(UTC).date() if since else None
        hi = (until - timedelta(microseconds=1)).astimezone(UTC).date() if until else None
        files = [
            str(p)
            for d in self.days()
            if (lo is None or d >= lo) and (hi is None or d <= hi)
            for p in self.parts(d)
        ]
        where = pc.scalar(True) if filter is None else filter
        if since is not None:
            where = where & (pc.field("time") >= pa.scalar(since, _TIME))
        if until is not None:
            where = where & (pc.field("time") < pa.scalar(until, _TIME))
        dataset = ds.dataset(files, schema=self.schema, format="parquet")
        return dataset.to_table(columns=list(columns) if columns else None, filter=where)


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A sort key: a dictionary column's indices (its chunks share one dictionary)."""
    if not pa.types.is_dictionary(column.type):
        return column
    return pa.chunked_array([c.indices for c in column.chunks], column.type.index_type)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
