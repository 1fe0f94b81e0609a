"""The audit's two tables (usage samples, gateway traffic) and their validation.

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

The store of these tables is `sample_store.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from gpuplane.errors import GpuplaneError

KINDS = ("inference", "batch", "")
# text columns where "" is a value (unknown, or nothing allocated): coerce reads null as ""
BLANK_TEXT = ("gpu_model", "workload", "team", "kind")

_STR = pa.dictionary(pa.int32(), pa.string())
TIME_TYPE = pa.timestamp("s", tz="UTC")

SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("time", TIME_TYPE, nullable=False),
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
        pa.field("time", TIME_TYPE, nullable=False),
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
                pc.if_else(zoned, column, None).cast(TIME_TYPE),
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
