"""The PostgreSQL lease store: one row per lease key, claimed in one transaction that locks
the row (`SELECT ... FOR UPDATE`), reads the database's clock and decides with the pure
`lease.take`; the journal is written by a conditional UPDATE that compares the epoch.

The table (`gpuplane_gateway_lease`) is created on first use. Times are the database's
`clock_timestamp()` in seconds, so the gateways' own clocks never meet.
"""

from __future__ import annotations

import psycopg

from gpuplane.serve.ha.lease import (
    LeaderLease,
    LeaseRecord,
    answer,
    check_epoch,
    released,
    take,
)
from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import Journal, LeaseStore, register

TABLE = "gpuplane_gateway_lease"
_CREATE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    key text PRIMARY KEY,
    holder text,
    epoch bigint NOT NULL DEFAULT 0,
    expires_at double precision NOT NULL DEFAULT 0,
    url text,
    journal_epoch bigint,
    journal bytea
)"""
_LOCK = f"""
SELECT holder, epoch, expires_at, url, extract(epoch FROM clock_timestamp())::float8
FROM {TABLE} WHERE key = %s FOR UPDATE"""
_PUT = f"UPDATE {TABLE} SET holder = %s, epoch = %s, expires_at = %s, url = %s WHERE key = %s"


@register
class PostgresStore(LeaseStore):
    name = "postgresql"
    errors = (psycopg.Error, OSError)

    def __init__(self, cfg: HaConfig, timeout_s: float) -> None:
        super().__init__(cfg, timeout_s)
        assert cfg.url is not None  # the settings require it for lease: postgresql
        self.url = cfg.url
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = await psycopg.AsyncConnection.connect(
                self.url, connect_timeout=max(1, round(self.timeout_s)), autocommit=True
            )
            await conn.execute(_CREATE)
            await conn.execute(
                f"INSERT INTO {TABLE} (key) VALUES (%s) ON CONFLICT DO NOTHING", (self.key,)
            )
            self._conn = conn
        return self._conn

    async def _locked(
        self,
    ) -> tuple[psycopg.AsyncConnection[tuple[object, ...]], LeaseRecord | None, float]:
        conn = await self._connection()
        row = await (await conn.execute(_LOCK, (self.key,))).fetchone()
        assert row is not None  # inserted when connecting, never deleted
        holder, epoch, expires_at, url, now = row
        record = (
            None
            if holder is None
            else LeaseRecord(str(holder), int(str(epoch)), float(str(expires_at)), _opt(url))
        )
        return conn, record, float(str(now))

    async def _claim(self, holder: str, url: str | None, ttl_s: float) -> LeaderLease:
        conn = await self._connection()
        async with conn.transaction():
            conn, current, now = await self._locked()
            record = take(current, holder, url, now, ttl_s)
            if record != current:
                await self._put(conn, record)
        return answer(record, now)

    async def _release(self, holder: str, epoch: int) -> None:
        conn = await self._connection()
        async with conn.transaction():
            conn, current, now = await self._locked()
            record = released(current, holder, epoch, now)
            if record is not None and record != current:
                await self._put(conn, record)

    async def _write_journal(self, epoch: int, data: bytes) -> None:
        conn = await self._connection()
        async with conn.transaction():
            conn, current, _ = await self._locked()
            check_epoch(current.epoch if current is not None else 0, epoch)
            await conn.execute(
                f"UPDATE {TABLE} SET journal_epoch = %s, journal = %s WHERE key = %s",
                (epoch, data, self.key),
            )

    async def _read_journal(self) -> Journal | None:
        conn = await self._connection()
        cur = await conn.execute(
            f"SELECT journal_epoch, journal FROM {TABLE} WHERE key = %s", (self.key,)
        )
        row = await cur.fetchone()
        if row is None or row[0] is None:
            return None
        data = row[1]
        return Journal(
            int(str(row[0])), bytes(data) if isinstance(data, bytes | memoryview) else b""
        )

    async def _put(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], record: LeaseRecord
    ) -> None:
        await conn.execute(
            _PUT, (record.holder, record.epoch, record.expires_at, record.url, self.key)
        )

    async def _close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def _broken(self) -> None:
        # a transaction cut off by the deadline leaves the connection mid-way: start afresh
        if self._conn is not None:
            self._conn.pgconn.finish()
            self._conn = None


def _opt(value: object) -> str | None:
    return None if value is None else str(value)
