"""Import recorded samples (or traffic) from CSV or Parquet files, validated before any is stored.

A CSV file has a header row naming the schema's columns (any order, extra columns refused);
times are ISO 8601, with a zone offset or read as UTC; an empty field is null (unknown). Every
file is read and validated before the first one is written, so a bad file names its column and
row and leaves the store as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from gpuplane.audit.sample_store import SampleStore
from gpuplane.audit.samples import SAMPLE_SCHEMA, SampleError, coerce, validate


def read(path: Path, schema: pa.Schema = SAMPLE_SCHEMA) -> pa.Table:
    """One file (`.csv`, `.parquet`) as a validated table of `schema`; a `SampleError` names the
    file, the column and the row (for CSV, also the line)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            raw = pcsv.read_csv(
                path,
                convert_options=pcsv.ConvertOptions(
                    column_types={name: pa.string() for name in schema.names},
                    strings_can_be_null=True,
                ),
            )
        elif suffix in (".parquet", ".pq"):
            raw = pq.read_table(path)
        else:
            raise SampleError(f"{path}: unknown file type '{suffix}'; use .csv or .parquet")
    except (OSError, pa.ArrowInvalid) as exc:
        raise SampleError(f"{path}: cannot read: {exc}") from None
    extra = [c for c in raw.column_names if c not in schema.names]
    if extra:
        raise SampleError(
            f"{path}: unknown column(s) {', '.join(extra)}; valid: {', '.join(schema.names)}",
            extra[0],
        )
    try:
        table = coerce(raw, schema)
        validate(table)
    except SampleError as exc:
        # a CSV's header is line 1, its first row line 2
        line = f" (line {exc.row + 2})" if suffix == ".csv" and exc.row is not None else ""
        raise SampleError(f"{path}: {exc}{line}", exc.column, exc.row) from None
    return table


def import_files(paths: Sequence[Path], store: SampleStore) -> int:
    """Validate every file, then append them all; returns the rows stored. Nothing is written
    when any file is refused."""
    tables = [read(p, store.schema) for p in paths]
    for table in tables:
        store.append(table)
    return sum(t.num_rows for t in tables)
