"""The lease store interface, its shared base and the registry of stores by name.

A store keeps one leader lease per key and, beside it, the leader's slot journal. Its four
operations are called by the gateway's lease loop: `claim` every `renew_s`, `write_journal`
after a renewal while leading, `read_journal` when it takes over, `release` once on shutdown.
The base owns what every store shares: the per-call deadline and the mapping of the driver's
errors to `StoreUnavailable`, once, here. A store module only says how its server does each
operation atomically (`_claim`, `_release`, `_write_journal`, `_read_journal`, `_close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from gpuplane.errors import ConfigError, unknown_name
from gpuplane.serve.ha.lease import Fenced, LeaderLease, StoreUnavailable
from gpuplane.serve.ha.settings import HaConfig

log = logging.getLogger("gpuplane.gateway.ha")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Journal:
    """The leader's last slot journal: in flight per instance, as written in `epoch`."""

    epoch: int
    data: bytes


class LeaseStore:
    """Base of every lease store; subclasses set `name` and `errors` and implement the `_x`s."""

    name: ClassVar[str] = ""
    # the driver's exceptions that mean "the store did not answer"
    errors: ClassVar[tuple[type[BaseException], ...]] = (OSError,)

    def __init__(self, cfg: HaConfig, timeout_s: float) -> None:
        self.cfg = cfg
        self.key = cfg.key
        self.timeout_s = timeout_s

    async def claim(self, holder: str, url: str | None, ttl_s: float) -> LeaderLease:
        """Take the lease when it is free or has run out (next epoch), renew it when `holder`
        has it (same epoch); answer the lease as it now stands, whoever holds it."""
        return await self._call("claim", self._claim(holder, url, ttl_s))

    async def release(self, holder: str, epoch: int) -> None:
        """Give the lease up if `holder` still has it in `epoch`, so that a standby takes over
        without waiting out the TTL. Idempotent, and never fails: a store that does not answer
        lets the lease run out instead."""
        try:
            await self._call("release", self._release(holder, epoch))
        except StoreUnavailable as exc:
            log.warning("could not release the leader lease (it runs out by itself): %s", exc)

    async def write_journal(self, epoch: int, data: bytes) -> None:
        """Store the slot journal written in `epoch`; raises `Fenced` when the lease is in a
        newer epoch."""
        await self._call("journal write", self._write_journal(epoch, data))

    async def read_journal(self) -> Journal | None:
        """The last journal accepted, if any."""
        return await self._call("journal read", self._read_journal())

    async def aclose(self) -> None:
        with contextlib.suppress(StoreUnavailable):  # a store that is gone needs no closing
            await self._call("close", self._close())

    async def _call(self, what: str, op: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(op, self.timeout_s)
        except Fenced:
            raise
        except TimeoutError:
            self._broken()
            raise StoreUnavailable(
                f"the {self.name} lease store did not answer a {what} within "
                f"{self.timeout_s:g} s ({self.where})"
            ) from None
        except self.errors as exc:
            self._broken()
            raise StoreUnavailable(
                f"the {self.name} lease store failed a {what} ({self.where}): {exc}"
            ) from None

    @property
    def where(self) -> str:
        return self.cfg.path or self.cfg.url or ""

    async def _claim(self, holder: str, url: str | None, ttl_s: float) -> LeaderLease:
        raise NotImplementedError

    async def _release(self, holder: str, epoch: int) -> None:
        raise NotImplementedError

    async def _write_journal(self, epoch: int, data: bytes) -> None:
        raise NotImplementedError

    async def _read_journal(self) -> Journal | None:
        raise NotImplementedError

    async def _close(self) -> None:
        return None

    def _broken(self) -> None:
        """A call failed or timed out midway: drop what cannot be trusted (a connection)."""


_REGISTRY: dict[str, type[LeaseStore]] = {}
_BUILTIN = ("file", "postgresql", "redis", "etcd")


def register(cls: type[LeaseStore]) -> type[LeaseStore]:
    """Class decorator: make a store available under `cls.name`."""
    _REGISTRY[cls.name] = cls
    return cls


def make_store(cfg: HaConfig, timeout_s: float | None = None) -> LeaseStore:
    """The store `cfg.lease` names; each call's deadline is `timeout_s` (default: what is
    left of a lease renewed now, since a later answer could not keep it)."""
    if cfg.lease not in _REGISTRY and cfg.lease in _BUILTIN:
        importlib.import_module(f"gpuplane.serve.ha.{cfg.lease}")
    cls = _REGISTRY.get(cfg.lease)
    if cls is None:
        raise ConfigError(unknown_name("lease store", cfg.lease, set(_REGISTRY) | set(_BUILTIN)))
    return cls(cfg, timeout_s if timeout_s is not None else cfg.lease_ttl_s - cfg.stop_margin_s)
