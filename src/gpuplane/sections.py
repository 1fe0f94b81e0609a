"""The base of every settings section: frozen, and an unknown key is an error.

Each tier declares its own sections (`serve/settings.py`, `batch/settings.py`,
`control/settings.py`) on this base; `config.py` assembles them into one file and names the
nearest valid key when one is unknown.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
