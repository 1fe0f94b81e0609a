"""Policies by name: `@register` on the class, `make_policy(name)` to build one.

An unknown name fails with the list of valid ones, before any work is done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpuplane.control.scheduler.base import Policy
from gpuplane.errors import GpuplaneError, unknown_name

DEFAULT_POLICY = "frag"

_REGISTRY: dict[str, type[Policy]] = {}
P = TypeVar("P", bound=type[Policy])


class UnknownPolicyError(GpuplaneError):
    """No scheduling policy has that name."""


def register(cls: P) -> P:
    """Class decorator: make the policy available under `cls.name`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    # importing the package registers every built-in policy (one module each)
    import gpuplane.control.scheduler.policies  # noqa: F401


def policy_names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    _load()
    key = name.strip().lower().replace("_", "-")
    try:
        return _REGISTRY[key]
    except KeyError:
        raise UnknownPolicyError(unknown_name("scheduling policy", name, _REGISTRY)) from None


def make_policy(name: str = DEFAULT_POLICY, **options: Any) -> Policy:
    """A fresh policy object; `options` go to its constructor (e.g. `mix=` for frag/fgd)."""
    factory: Callable[..., Policy] = policy_class(name)
    return factory(**options)
