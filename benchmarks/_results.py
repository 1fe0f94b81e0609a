"""What the benchmarks do with their figures: stamp the machine, write the JSON, say where.

Every benchmark writes through `save`, so the one rule about recorded runs lives here: a quick
run (`--quick`: fewer seeds, shorter holds) never replaces a recorded full run. Its figures go to
a `quick/` folder beside the file it would have written (`benchmarks/results/quick/`, ignored by
git), where the next quick run replaces them.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

QUICK_DIR = "quick"


def destination(path: Path, *, quick: bool) -> Path:
    """Where a run meant for `path` writes: `path` itself for a full run; for a quick run the
    same name in the `quick/` folder beside it, so that a recorded full run stays as it was."""
    if not quick or path.parent.name == QUICK_DIR:
        return path
    return path.parent / QUICK_DIR / path.name


def save(out: dict[str, Any], path: Path, *, quick: bool = False, echo_json: bool = False) -> Path:
    """Add the machine and whether the run was quick to `out`, write it as indented JSON to
    `destination(path)` and say where; with `echo_json` (the scripts' --json) also print it as
    one line. Returns the path written."""
    out["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    out["quick"] = quick
    target = destination(path, quick=quick)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {target}" + (" (a quick run: recorded full runs are kept)" if quick else ""))
    if echo_json:
        print(json.dumps(out))
    return target
