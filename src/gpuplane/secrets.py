"""Reading a secret (a token, a key, a shared secret) from the file a setting or flag names.

Only a reference to a secret (its path) is ever stored or passed on a command line; the secret
is read where it is used, by `read_secret`, so every reader refuses an unreadable or empty file
the same way, naming the file and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuplane.errors import ConfigError


def read_secret(
    path: str | Path,
    what: str,
    error: Callable[[str], Exception] = ConfigError,
    *,
    strip: bool = True,
) -> str:
    """The secret in the file at `path`, without surrounding whitespace (with `strip=False`,
    less only a trailing newline). An unreadable or empty file raises `error` with a message
    that starts with `what` (the file, and the setting or flag that names it)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise error(f"{what} cannot be read ({exc.strerror})") from exc
    secret = text.strip() if strip else text.removesuffix("\n")
    if not secret:
        raise error(f"{what} is empty; write the secret in it")
    return secret
