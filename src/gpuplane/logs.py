"""Logging for every gpuplane command: readable on a terminal, one JSON event per line otherwise."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter
from rich.console import Console
from rich.logging import RichHandler

# one line per request or probe, or per migration check at every start, otherwise
QUIET = ("httpx", "httpcore", "uvicorn.access", "alembic")


def configure(level: int = logging.INFO) -> None:
    """Route log records to stderr: Rich on a terminal, JSON lines when piped or in a service."""
    handler: logging.Handler
    if sys.stderr.isatty():
        # stderr: Rich's default console writes to stdout, among a command's output
        handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)
        # the message only: Rich prints the time and level in columns of its own (basicConfig's
        # default format would print the level and logger again)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            JsonFormatter("{asctime}{levelname}{name}{message}", style="{", timestamp=False)
        )
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
