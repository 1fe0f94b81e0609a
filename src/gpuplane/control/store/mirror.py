"""The in-memory `Estate` that mirrors the store, and the locked transaction that keeps it so.

Every change to allocations runs in `Mirror.locked()`: the lock row's version says whether the
mirror is current (it is rebuilt from the store, inside the same transaction, when another
process moved it), so commits never double-book a device, across threads or processes. The
mirror also remembers the store version at which the queue was last evaluated, so an idle
admission loop costs one `SELECT`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

from gpuplane.control.admission import Estate
from gpuplane.control.service.inventory import RowIds, load_estate
from gpuplane.control.store.store import Store


class Mirror:
    """The store's state as an `Estate`, current as of the last locked transaction. Thread-safe:
    `mutex` (re-entrant) guards the mirror and is held for the whole of a locked transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.mutex = threading.RLock()
        self._estate: Estate | None = None
        self._ids = RowIds()
        self._version: int | None = None
        self._settled: int | None = None  # store version at which the queue was last evaluated

    @contextmanager
    def locked(
        self, *, settles_queue: bool = False, neutral: bool = False
    ) -> Iterator[tuple[Session, Estate]]:
        """A locked store transaction and the estate, current as of this transaction.

        After the commit, `settles_queue` (the admission pass) records that the queue has been
        evaluated at this version, and `neutral` (a change that cannot make a pending job fit,
        e.g. admitted -> running) keeps that record; any other commit, here or in another
        process, means the next pass has to run."""
        with self.mutex:
            try:
                with self.store.locked() as (session, version):
                    estate = self._estate
                    if estate is None or self._version != version - 1:
                        estate = self._reload(session)
                    self._version = version
                    yield session, estate
            except BaseException:
                self.invalidate()
                raise
            if settles_queue or (neutral and self._settled == version - 1):
                self._settled = version

    def invalidate(self) -> None:
        """Forget the in-memory estate; the next transaction rebuilds it from the store."""
        with self.mutex:
            self._estate, self._version = None, None

    def settled(self) -> bool:
        """Was the queue evaluated at the store's current version (nothing committed since)?"""
        settled = self._settled
        return settled is not None and self.store.version() == settled

    def unsettle(self) -> None:
        """The next admission pass must run (jobs were requeued that it did not evaluate)."""
        self._settled = None

    def estate(self) -> tuple[Estate, RowIds]:
        """The current estate for reads (rebuilt if the store moved); do not mutate it."""
        with self.mutex:
            version = self.store.version()
            estate = self._estate
            if estate is None or self._version != version:
                with self.store.session() as session:
                    estate = self._reload(session)
                self._version = version
            return estate, self._ids

    @property
    def ids(self) -> RowIds:
        """Store row ids behind the estate's names, as of its last rebuild."""
        return self._ids

    def _reload(self, session: Session) -> Estate:
        """Rebuild the mirror from the store, keeping what only memory holds (`Estate.adopt`)."""
        estate, self._ids = load_estate(session)
        if self._estate is not None:
            estate.adopt(self._estate)
        self._estate = estate
        return estate
