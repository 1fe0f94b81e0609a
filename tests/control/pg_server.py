"""A throwaway PostgreSQL server for tests, started from the Debian binaries on a free port.

initdb and pg_ctl refuse to run as root, so as root they run as the `postgres` user (runuser).
Absent binaries skip the tests with the reason, except under CI (CI=true), where they fail.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_binaries() -> Path:
    bin_dir = _bin_dir()
    if bin_dir is None:
        msg = (
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin; "
            "run .ci/services.sh (apt-get install postgresql)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return bin_dir


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yield its SQLAlchemy URL; stop it and remove its files."""
    bin_dir = require_binaries()
    root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if root else []
    tmp = tempfile.mkdtemp(prefix="gpuplane-pg-")
    data = os.path.join(tmp, "data")
    if root:
        shutil.chown(tmp, "postgres", "postgres")
    port = _free_port()

    def run(*args: str) -> None:
        proc = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {proc.stdout}\n{proc.stderr}")

    started = False
    try:
        run(
            str(bin_dir / "initdb"),
            "-D",
            data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--no-locale",  # works whatever locales the machine has generated
        )
        opts = (
            f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        )
        run(
            str(bin_dir / "pg_ctl"),
            "-D",
            data,
            "-o",
            opts,
            "-l",
            os.path.join(tmp, "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        started = True
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bin_dir / "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(tmp, ignore_errors=True)


def create_database(admin_url: str, name: str) -> str:
    """A fresh database on the server of `admin_url`; returns its URL."""
    from sqlalchemy import create_engine, text

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{name}"
