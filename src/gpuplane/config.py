"""One YAML file (gpuplane.yaml) to typed settings; every setting has an embedded default.

Each tier owns its sections (`serve/settings.py`, `control/settings.py`); this module only
assembles them and reads the file. An unknown key is an error that names the nearest valid key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuplane.audit.settings import AuditSettings
from gpuplane.batch.settings import BatchConfig
from gpuplane.control.settings import ControlConfig
from gpuplane.errors import ConfigError, explain
from gpuplane.serve.settings import ServeSettings


class Settings(ServeSettings):
    """The whole file: the gateway's sections at the top level, then one section per tier."""

    batch: BatchConfig = BatchConfig()
    control: ControlConfig = ControlConfig()
    audit: AuditSettings = AuditSettings()


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read and validate a config file (or none: embedded defaults) plus top-level overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p} must hold a mapping at the top, got {type(loaded).__name__}")
        data = loaded
    data.update(overrides)
    return parse_settings(data, source=str(path) if path else "defaults")


def parse_settings(data: dict[str, Any], source: str = "config") -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            f"{source}: " + "; ".join(explain(e, Settings) for e in exc.errors())
        ) from None
