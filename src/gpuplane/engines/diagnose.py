"""What an engine process's exit means: the signal or exit code, its likely cause, what to do.

One classifier for every place that watches an engine die: the supervisor (a crash while
serving or starting) and `gpuplane engine smoke` (the one-token check). Pure but for
`log_tail`, which reads the end of a log file.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CPU_HINT = (
    "the engine binary uses CPU instructions this machine lacks or mishandles (e.g. a native "
    "build on a CPU with AMX): rebuild it portably with `make engine-rebuild`"
)
MEMORY_HINT = (
    "it was most likely killed by the kernel's out-of-memory killer (see `dmesg`): free memory, "
    "or lower engine.instances, engine.n_ctx or engine.cache_bytes"
)
# Signals that mean the engine's machine code itself failed, not its input or its host.
_CPU_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGILL})
TAIL_LINES = 5
_TAIL_BYTES = 8192
_LINE_CHARS = 200


@dataclass(frozen=True, slots=True)
class ExitDiagnosis:
    """A classified exit: `cause` says what happened, `hint` what to do about it."""

    returncode: int
    cause: str  # "was killed by SIGSEGV (Segmentation fault)", "exited with code 1"
    hint: str
    signal: str | None = None  # the signal's name when a signal ended the process

    def explain(self) -> str:
        return f"{self.cause}: {self.hint}"


def classify_exit(returncode: int, tail: Sequence[str] = ()) -> ExitDiagnosis:
    """Classify a process's return code as asyncio and subprocess report it (a negative code
    is the signal that ended it); `tail` is the end of its output, quoted when nothing more
    specific is known."""
    quoted = (
        "its log ends with: " + " | ".join(tail)
        if tail
        else "its log is empty; run the engine's command by hand to see why"
    )
    if returncode >= 0:
        return ExitDiagnosis(returncode, f"exited with code {returncode}", quoted)
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return ExitDiagnosis(returncode, f"was killed by signal {-returncode}", quoted)
    cause = f"was killed by {sig.name} ({signal.strsignal(sig) or 'no description'})"
    if sig in _CPU_SIGNALS:
        hint = CPU_HINT
    elif sig is signal.SIGKILL:
        hint = MEMORY_HINT
    else:
        hint = quoted
    return ExitDiagnosis(returncode, cause, hint, sig.name)


def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last non-empty `lines` of a log file (each cut to 200 characters); [] if unreadable."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return tail_of(text, lines)


def tail_of(text: str, lines: int = TAIL_LINES) -> list[str]:
    """The last non-empty `lines` of `text`, each stripped and cut to 200 characters."""
    kept = [line.strip()[:_LINE_CHARS] for line in text.splitlines() if line.strip()]
    return kept[-lines:]
