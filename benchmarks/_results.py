"""What the benchmarks do with their figures: stamp the machine, write the JSON, say where."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def save(out: dict[str, Any], path: Path, *, echo_json: bool = False) -> None:
    """Add the machine to `out`, write it to `path` as indented JSON and say so; with
    `echo_json` (the scripts' --json) also print it as one line."""
    out["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    if echo_json:
        print(json.dumps(out))
