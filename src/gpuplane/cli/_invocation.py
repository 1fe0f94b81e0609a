"""How the user's shell runs `gpuplane`: the commands the CLI prints (the banner of `up`) must
work as printed, and a venv's `bin/` is often not on PATH (`make run` runs `.venv/bin/gpuplane`
without activating the venv)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

NAME = "gpuplane"


@dataclass(frozen=True, slots=True)
class CliInvocation:
    """`command`: what to type for `gpuplane` (`gpuplane`, `.venv/bin/gpuplane`, or an absolute
    path); `hint`: how to make the bare name work, when it does not (None when it does)."""

    command: str
    hint: str | None = None


def invocation_of(script: Path | None, on_path: Path | None, cwd: Path) -> CliInvocation:
    """Pure: the invocation of the installed `script` (None: no script, run as a module), given
    what PATH finds for `gpuplane` (`on_path`, None: nothing) and the working directory. The bare
    name only when PATH finds this very script; else its path, relative when under `cwd`, with
    the venv's `activate` as the hint when there is one beside it."""
    if script is None:
        return CliInvocation(f"{shlex.quote(sys.executable)} -m gpuplane.cli.main")
    if on_path is not None and _same(on_path, script):
        return CliInvocation(NAME)
    absolute = script if script.is_absolute() else cwd / script
    try:
        shown = str(absolute.relative_to(cwd))
        shown = shown if "/" in shown else f"./{shown}"  # a bare name is looked up on PATH
    except ValueError:
        shown = str(absolute)
    if (absolute.parent / "activate").exists():
        activate = shown.removesuffix(NAME) + "activate"
        hint = f"`source {shlex.quote(activate)}` puts `{NAME}` on your PATH"
    else:
        hint = f"add {shlex.quote(str(absolute.parent))} to your PATH to type `{NAME}`"
    return CliInvocation(shlex.quote(shown), hint)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def installed_script() -> Path | None:
    """The `gpuplane` script this process runs as (argv[0]), else the one installed beside this
    Python (a venv's `bin/`); None when there is none."""
    argv0 = Path(sys.argv[0])
    if argv0.name == NAME and argv0.is_file():
        return argv0
    beside = Path(sysconfig.get_path("scripts")) / NAME
    return beside if beside.is_file() else None


def invocation() -> CliInvocation:
    """The invocation of this process's `gpuplane` from the user's shell (this PATH, this
    working directory)."""
    found = shutil.which(NAME)
    return invocation_of(installed_script(), Path(found) if found else None, Path(os.getcwd()))
