"""The base of every settings section: frozen, and an unknown key is an error.

Each tier declares its own sections (`serve/settings.py`, `batch/settings.py`,
`control/settings.py`) on this base; `config.py` assembles them into one file and names the
nearest valid key when one is unknown, or the new name of a renamed one (`renamed`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from gpuplane.errors import GpuplaneError

T = TypeVar("T")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # old key -> the key it was renamed to: a file still using the old one is refused with it
    renamed: ClassVar[Mapping[str, str]] = {}


def passes(check: Callable[[T], object], value: T) -> T:
    """`value`, once `check(value)` accepts it: a field validator's body. The project error that
    `check` raises becomes the ValueError pydantic reports at the field's path."""
    try:
        check(value)
    except GpuplaneError as exc:
        raise ValueError(str(exc)) from None
    return value
