"""The CLI's options that carry a secret (tokens, admin and API keys): from the environment or
from a file (`--token @PATH`), never as a value on the command line, where every process on the
host reads it in /proc/PID/cmdline and `ps`."""

from __future__ import annotations

from functools import partial
from typing import Any

import typer
from typer import BadParameter

from gpuplane.secrets import read_secret


def secret_option(flag: str, envvar: str, help: str, **kwargs: Any) -> Any:
    """A typer option for a secret: its value comes from `$envvar`, or from the file named after
    an `@` (`--flag @PATH`, its content less the trailing newline); a value typed on the command
    line is refused with the two ways to pass it instead."""
    return typer.Option(
        None,
        flag,
        envvar=envvar,
        help=f"{help}: ${envvar}, or {flag} @FILE (never the value itself on the command line)",
        callback=_from_env_or_file(flag, envvar),
        show_default=False,
        **kwargs,
    )


def _from_env_or_file(flag: str, envvar: str) -> Any:
    def read(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
        if value is None or param.name is None:
            return value
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name != "COMMANDLINE":  # the environment, or none given
            return value
        if not value.startswith("@"):
            raise typer.BadParameter(
                "a secret given on the command line is readable by every process on this host "
                f"(/proc/PID/cmdline); pass it in ${envvar}, or in a file: {flag} @FILE",
                param_hint=flag,
            )
        return read_secret(
            value[1:], value[1:], partial(BadParameter, param_hint=flag), strip=False
        )

    return read
