"""The pipeline API: stages (name, version, resources, cache policy) wired into a DAG over clips.

A pipeline is source (clips) → stage A → several independent stage-B modules reading A's output
→ a per-clip aggregation. Stages are plain functions or classes; a class is instantiated once
per worker (load a model in `__init__`), then called per clip. Cache keys are pure functions of
the stage's identity and the clip's fingerprint, so they are known before any data is read.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpuplane.batch.errors import BatchError
from gpuplane.errors import unknown_name
from gpuplane.resources import Slice

CLIP = "clip"
"""The input name of a stage that reads the decoded clip itself."""


class CachePolicy(StrEnum):
    """What a stage does with the stage cache."""

    USE = "use"  # read a verified entry if present, else compute and write
    REFRESH = "refresh"  # always compute, then overwrite the entry
    OFF = "off"  # never read nor write (no-op or non-deterministic stages)


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of a pipeline: `fn(*inputs, **params)`, or `fn(**params)(*inputs)` for a class."""

    name: str
    version: str
    fn: Callable[..., Any]
    inputs: tuple[str, ...] = (CLIP,)
    slice: Slice = field(default_factory=Slice)
    cpu: float = 1.0
    cache: CachePolicy = CachePolicy.USE
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise BatchError(f"stage name {self.name!r}: use letters, digits, '_' or '-'")
        if not self.version:
            raise BatchError(f"stage {self.name!r} needs a non-empty version, e.g. version='1'")
        try:
            json.dumps(dict(self.params), sort_keys=True)
        except TypeError as exc:
            raise BatchError(
                f"stage {self.name!r}: params must be JSON-serialisable ({exc}); "
                "pass paths or numbers, not objects"
            ) from exc

    @property
    def is_class(self) -> bool:
        return inspect.isclass(self.fn)

    def inputs_from(self, clip: Any, outputs: Mapping[str, Any]) -> tuple[Any, ...]:
        """The stage's arguments: the decoded clip for `CLIP`, else that stage's output."""
        return tuple(clip if d == CLIP else outputs[d] for d in self.inputs)

    def code_fingerprint(self) -> str:
        """Digest of the stage's source code (its bytecode when the source is unavailable)."""
        try:
            text = inspect.getsource(self.fn).encode()
        except (OSError, TypeError):
            code = getattr(self.fn, "__code__", None)
            text = code.co_code if code is not None else repr(self.fn).encode()
        return hashlib.sha256(text).hexdigest()[:16]

    def fingerprint(self) -> str:
        """Digest of everything that defines this stage's output apart from its inputs."""
        doc = {
            "name": self.name,
            "version": self.version,
            "code": self.code_fingerprint(),
            "params": dict(self.params),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def with_version(self, version: str) -> Stage:
        return Stage(
            self.name, version, self.fn, self.inputs, self.slice, self.cpu, self.cache, self.params
        )


def stage(
    name: str | None = None,
    *,
    version: str = "1",
    inputs: tuple[str, ...] = (CLIP,),
    slice: Slice | None = None,
    cpu: float = 1.0,
    cache: CachePolicy | str = CachePolicy.USE,
    params: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Stage]:
    """Decorator: turn a function or class into a `Stage`."""

    def wrap(fn: Callable[..., Any]) -> Stage:
        return Stage(
            name=name or fn.__name__,
            version=version,
            fn=fn,
            inputs=inputs,
            slice=slice or Slice(),
            cpu=cpu,
            cache=CachePolicy(cache),
            params=dict(params or {}),
        )

    return wrap


def _identity(data: bytes) -> Any:
    return data


def _no_reduce(clip_id: str, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Stages in dependency order, a decoder for raw clip bytes, a per-clip reduction (its
    record goes to the journal) and an optional fold of the records into the run's aggregate."""

    name: str
    stages: tuple[Stage, ...]
    decode: Callable[[bytes], Any] = _identity
    reduce: Callable[[str, Mapping[str, Any]], dict[str, Any]] = _no_reduce
    # the aggregation over clips, as a fold: aggregate(running total, one clip's record)
    aggregate: Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]] | None = None
    # computed once: reading source (inspect + ast) per clip is slow and not thread-safe on 3.11
    fingerprints: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for s in self.stages:
            if s.name in seen or s.name == CLIP:
                raise BatchError(f"pipeline {self.name!r}: stage name {s.name!r} is used twice")
            for dep in s.inputs:
                if dep != CLIP and dep not in seen:
                    raise BatchError(
                        f"stage {s.name!r} reads {dep!r}, which is not an earlier stage; "
                        f"known: {[CLIP, *sorted(seen)]}"
                    )
            seen.add(s.name)
        if not self.stages:
            raise BatchError(f"pipeline {self.name!r} has no stages")
        object.__setattr__(self, "fingerprints", {s.name: s.fingerprint() for s in self.stages})

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise BatchError(f"no stage {name!r}; stages: {[s.name for s in self.stages]}")

    def looked_up(self) -> tuple[Stage, ...]:
        """The stages whose cache entry is read before they would run (`CachePolicy.USE`)."""
        return tuple(s for s in self.stages if s.cache is CachePolicy.USE)

    def consumers(self, name: str) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if name in s.inputs)

    def fingerprint(self) -> str:
        parts = [self.fingerprints[s.name] for s in self.stages]
        return hashlib.sha256("|".join([self.name, *parts]).encode()).hexdigest()[:16]

    def with_versions(self, versions: Mapping[str, str]) -> Pipeline:
        """A copy with some stages' versions replaced (a release bump)."""
        names = [s.name for s in self.stages]
        unknown = sorted(set(versions) - set(names))
        if unknown:
            raise BatchError(
                f"pipeline {self.name!r}: cannot set a version of "
                + "; ".join(unknown_name("stage", n, names) for n in unknown)
            )
        stages = tuple(
            s.with_version(versions[s.name]) if s.name in versions else s for s in self.stages
        )
        return Pipeline(self.name, stages, self.decode, self.reduce, self.aggregate)


def cache_keys(pipeline: Pipeline, clip_fingerprint: str) -> dict[str, str]:
    """Each stage's cache key: its fingerprint, its upstream keys and the clip's fingerprint."""
    keys: dict[str, str] = {CLIP: clip_fingerprint}
    for s in pipeline.stages:
        doc = {
            "stage": s.name,
            "fp": pipeline.fingerprints[s.name],
            "upstream": [keys[d] for d in s.inputs],
            "clip": clip_fingerprint,
        }
        keys[s.name] = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    del keys[CLIP]
    return keys


class BoundStage:
    """A stage ready to call in one worker: a class stage is instantiated once, lazily."""

    __slots__ = ("_call", "stage")

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self._call: Callable[..., Any] | None = None

    def __call__(self, *inputs: Any) -> Any:
        if self._call is None:
            params = dict(self.stage.params)
            if self.stage.is_class:
                self._call = self.stage.fn(**params)
            else:
                fn = self.stage.fn
                self._call = (lambda *a: fn(*a, **params)) if params else fn
        return self._call(*inputs)


_FORMS = "pass a directory with pipeline.py, a .py file, or module:attr"


def load_pipeline(spec: str, versions: Mapping[str, str] | None = None) -> Pipeline:
    """Load a pipeline from `dir/` (its pipeline.py), `file.py` or `module:attr`.

    The attribute (default `build_pipeline`, then `PIPELINE`) is a Pipeline or a function
    returning one. `versions` bumps stage versions, as a release does.
    """
    module_name, _, attr = spec.partition(":")
    path = Path(module_name)
    if path.is_dir():
        path = path / "pipeline.py"
        if not path.is_file():
            raise BatchError(f"pipeline directory {path.parent} holds no pipeline.py; {_FORMS}")
    if path.suffix == ".py":
        if not path.is_file():
            raise BatchError(f"pipeline file {path} does not exist; {_FORMS}")
        module = _import_file(path)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
            if missing and f"{module_name}.".startswith(f"{missing}."):  # it, not what it imports
                raise BatchError(
                    f"pipeline {module_name!r} is neither a directory or .py file "
                    f"({path.resolve()} does not exist) nor an importable module; {_FORMS}"
                ) from None
            raise BatchError(f"cannot import pipeline module {module_name!r} ({exc})") from exc
    candidates = [attr] if attr else ["build_pipeline", "PIPELINE"]
    for cand in candidates:
        obj = getattr(module, cand, None)
        if obj is None:
            continue
        pipe = obj() if callable(obj) and not isinstance(obj, Pipeline) else obj
        if not isinstance(pipe, Pipeline):
            raise BatchError(f"{spec}: {cand} gave {type(pipe).__name__}, not a Pipeline")
        return pipe.with_versions(versions) if versions else pipe
    if attr:
        own = [n for n, v in vars(module).items() if _could_build(v, module.__name__)]
        raise BatchError(f"{module_name}: " + unknown_name("pipeline attribute", attr, own))
    raise BatchError(f"{spec}: defines none of {candidates}; add `def build_pipeline()`")


def _import_file(path: Path) -> Any:
    name = "gpuplane_pipeline_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    module = sys.modules.get(name)
    if module is None:
        loaded = importlib.util.spec_from_file_location(name, path.resolve())
        if loaded is None or loaded.loader is None:
            raise BatchError(f"cannot import {path}")
        module = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module
        loaded.loader.exec_module(module)
    return module


def _could_build(value: object, module: str) -> bool:
    """A Pipeline, or a public function the module defines: what `module:attr` may name."""
    if isinstance(value, Pipeline):
        return True
    return inspect.isfunction(value) and value.__module__ == module and value.__name__[0] != "_"
