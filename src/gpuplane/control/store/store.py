"""The control plane's database: engine set-up, migrations on open, and the locked transaction.

SQLite (a file, the default) and PostgreSQL are both supported. Every transaction that changes
allocations or job states goes through `Store.locked()`, whose first statement bumps the single
`scheduler_lock` row: that takes PostgreSQL's row lock and SQLite's write lock before anything is
read, so placement commits are serialised across threads and processes, and the returned version
tells the service whether its in-memory snapshot is still the store's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gpuplane.control.store.models import SchedulerLock
from gpuplane.errors import GpuplaneError

MIGRATIONS = Path(__file__).parent / "migrations"


class StoreError(GpuplaneError):
    """The store cannot be opened or migrated."""


class Store:
    """One database: sessions, the placement lock and schema migrations."""

    def __init__(self, url: str) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise StoreError(
                f"'{url}' is not a database URL; use sqlite:///path/to/file.db or "
                "postgresql+psycopg://user@host:port/db"
            ) from None
        self.url = url
        self.backend = parsed.get_backend_name()
        kwargs: dict[str, Any] = {}
        if self.backend == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 60}
        elif self.backend == "postgresql":
            if parsed.drivername == "postgresql":
                parsed = parsed.set(drivername="postgresql+psycopg")
            kwargs["pool_size"] = 10
            kwargs["max_overflow"] = 20
        else:
            raise StoreError(f"unsupported database '{self.backend}'; use sqlite or postgresql")
        try:
            self.engine: Engine = create_engine(parsed, **kwargs)
        except ModuleNotFoundError as exc:
            raise StoreError(
                f"the driver for {self.backend} is not installed ({exc.name}); "
                "install gpuplane[postgres]"
            ) from None
        if self.backend == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect and bring the schema to the newest migration."""
        store = cls(url)
        store.migrate()
        return store

    def migrate(self) -> None:
        """Run Alembic migrations up to head (idempotent)."""
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self.engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except OperationalError as exc:
            raise StoreError(f"cannot open the store at {self.safe_url}: {exc.orig}") from None

    @property
    def safe_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def session(self) -> Session:
        """A plain session for reads and for writes that do not touch allocations."""
        return self._sessions()

    @contextmanager
    def locked(self) -> Iterator[tuple[Session, int]]:
        """A transaction holding the placement lock; yields the session and the new version."""
        with self._sessions() as session, session.begin():
            version = session.execute(
                update(SchedulerLock)
                .where(SchedulerLock.id == 1)
                .values(version=SchedulerLock.version + 1)
                .returning(SchedulerLock.version)
            ).scalar_one()
            yield session, version

    def version(self) -> int:
        with self._sessions() as session:
            return session.execute(select(SchedulerLock.version)).scalar_one()

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()
