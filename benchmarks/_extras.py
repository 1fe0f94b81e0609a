"""What a benchmark needs beyond the base install: one line naming the extra, exit code 2.

A benchmark that imports an optional package, or starts a program an extra installs (the peer
routers of the `bench` extra), says which extra to install and stops before any work, instead
of a traceback halfway through a run. The extras are read from pyproject.toml, so this file
never repeats which package comes from where.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv running the benchmark, where extras put programs
MISSING_EXTRA = 2  # the exit code, as for a usage error
# an import name where it differs from its distribution's name
IMPORT_NAMES = {"llama_cpp": "llama_cpp_python", "jwt": "pyjwt", "pynvml": "nvidia_ml_py"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def extras_of(name: str) -> list[str]:
    """The extras in pyproject.toml that install the module or program `name`, in file order."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _normal(IMPORT_NAMES.get(name, name))
    return [
        extra
        for extra, requirements in table["optional-dependencies"].items()
        if any(_normal(re.split(r"[\[<>=!~;\s]", r, maxsplit=1)[0]) == wanted for r in requirements)
    ]


def missing(what: str, extras: list[str]) -> NoReturn:
    """Say in one line which extra installs `what`, and exit with code 2."""
    script = Path(sys.argv[0]).resolve()
    where = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    also = f" (or {', '.join(extras[1:])})" if extras[1:] else ""
    print(
        f"{where} needs {what}, from the {extras[0]} extra{also}: install it with "
        f"`{sys.executable} -m pip install -e '{ROOT}[{extras[0]}]'`",
        file=sys.stderr,
    )
    sys.exit(MISSING_EXTRA)


@contextmanager
def optional_imports() -> Iterator[None]:
    """Wrap a benchmark's imports that need an extra: a missing package an extra installs ends
    the run through `missing`; any other import error is a bug and propagates."""
    try:
        yield
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        extras = extras_of(top) if top else []
        if not extras:
            raise
        missing(top, extras)


def require_programs(*names: str) -> None:
    """Stop through `missing` unless every program in `names` is in this venv's bin/."""
    for name in names:
        if not (BIN / name).exists():
            missing(name, extras_of(name))
