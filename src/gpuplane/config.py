"""One YAML file (gpuplane.yaml) to typed settings; every setting has an embedded default.

Each tier owns its sections (`serve/settings.py`, `control/settings.py`); this module only
assembles them and reads the file. An unknown key is an error that names the nearest valid key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gpuplane.batch.settings import BatchConfig
from gpuplane.control.settings import ControlConfig
from gpuplane.errors import ConfigError
from gpuplane.serve.settings import ServeSettings


class Settings(ServeSettings):
    """The whole file: the gateway's sections at the top level, then one section per tier."""

    batch: BatchConfig = BatchConfig()
    control: ControlConfig = ControlConfig()


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
        raise ConfigError(f"{source}: " + "; ".join(_explain(e) for e in exc.errors())) from None


def _explain(error: Any) -> str:
    loc = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        parent = _model_at(Settings, error["loc"][:-1])
        key = str(error["loc"][-1])
        hint = ""
        if parent is not None:
            close = difflib.get_close_matches(key, list(parent.model_fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            hint += f"; valid keys: {', '.join(parent.model_fields)}"
        return f"unknown key '{loc}'{hint}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{loc or 'config'}: {message}"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The settings class that a validation error location points into."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
