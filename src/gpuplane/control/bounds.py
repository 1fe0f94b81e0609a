"""The range of every number a user sets in the control plane: in the schema, the description, the
error.

`bounded(lo, hi, description)` goes in a field's `Annotated[...]`: it sets pydantic's `ge`/`le`
and `allow_inf_nan=False` (so OpenAPI and the config reference show the range), ends the
description with the range, and turns any refusal of the value into one message that names the
range and what was given ("must be from 0 to 1000000, got inf"), so the API answers 422, never
500.

Counts the store keeps fit its INTEGER columns, which are 32-bit on PostgreSQL; the other bounds
are what the largest estate needs, with room to spare.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # a store INTEGER column (PostgreSQL: 32-bit)
MAX_GPUS = 10**6  # a quota, in GPUs (milli-GPUs of it still fit an INTEGER column)
MAX_GPUS_PER_NODE = 1024  # whole cards one job asks for, cards of one declared node
MAX_CARD_MEM_MIB = 16 * 1024 * 1024  # 16 TiB on one card
MAX_SECONDS = 10 * 365 * 86400  # ten years: time limits and waits
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0  # fair-share weight: a dominant share is divided by it


def bounded(lo: float, hi: float, description: str) -> FieldInfo:
    """Field metadata for a number from `lo` to `hi` (inclusive, finite)."""
    rule = f"from {_num(lo)} to {_num(hi)}"
    info: FieldInfo = Field(ge=lo, le=hi, allow_inf_nan=False, description=f"{description}; {rule}")
    info.metadata.append(WrapValidator(partial(_within, rule)))  # after ge/le: it words theirs
    return info


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _within(rule: str, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError as exc:
        whole = any(e["type"].startswith("int_") for e in exc.errors())
        got = repr(value)
        raise PydanticCustomError(
            "out_of_range",
            "must be {kind}{rule}, got {got}",
            {
                "kind": "a whole number " if whole else "",
                "rule": rule,
                "got": got if len(got) <= 40 else got[:37] + "...",
            },
        ) from None
