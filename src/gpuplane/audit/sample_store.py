"""The audit's sample store: the tables of `samples.py` as Parquet files by UTC day.

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
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gpuplane.audit.samples import SAMPLE_SCHEMA, TIME_TYPE, TRAFFIC_SCHEMA, SampleError, validate


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
            where = where & (pc.field("time") >= pa.scalar(since, TIME_TYPE))
        if until is not None:
            where = where & (pc.field("time") < pa.scalar(until, TIME_TYPE))
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
