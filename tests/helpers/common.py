"""Helpers every test package uses: loopback ports and a gateway's settings dict."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port something listens on while the block runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_settings(models: list[dict[str, Any]], **gateway: Any) -> dict[str, Any]:
    """A settings dict for a gateway on a free loopback port."""
    return {"gateway": {"host": "127.0.0.1", "port": 0, **gateway}, "models": models}


def alive(pid: int) -> bool:
    """Is process `pid` running (neither gone nor a zombie)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
