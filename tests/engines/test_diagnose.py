"""The exit classifier (`engines/diagnose.py`): what an engine's exit means, and the hint that
says what to do about it; the end of its log quoted where no signal explains it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpuplane.engines.diagnose import CPU_HINT, MEMORY_HINT, classify_exit, log_tail


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGILL], ids=lambda s: s.name)
def test_a_crash_in_machine_code_says_to_rebuild_the_engine_portably(sig: signal.Signals) -> None:
    diagnosis = classify_exit(-sig, ["some log line"])
    assert diagnosis.signal == sig.name
    assert diagnosis.cause.startswith(f"was killed by {sig.name} (")
    assert diagnosis.hint == CPU_HINT
    assert "`make engine-rebuild`" in diagnosis.explain()


def test_sigkill_points_at_memory() -> None:
    diagnosis = classify_exit(-signal.SIGKILL)
    assert diagnosis.signal == "SIGKILL"
    assert diagnosis.hint == MEMORY_HINT
    assert "out-of-memory" in diagnosis.explain()


def test_an_abort_or_an_exit_code_quotes_the_end_of_the_log() -> None:
    tail = ["Traceback (most recent call last):", "ValueError: Failed to load model"]
    aborted = classify_exit(-signal.SIGABRT, tail)
    assert aborted.signal == "SIGABRT"
    assert aborted.hint == (
        "its log ends with: Traceback (most recent call last): | ValueError: Failed to load model"
    )
    exited = classify_exit(1, tail)
    assert exited.signal is None
    assert exited.cause == "exited with code 1"
    assert exited.hint == aborted.hint
    assert "run the engine's command by hand" in classify_exit(2).hint


def test_an_unknown_signal_number_is_named_by_number() -> None:
    assert classify_exit(-200).cause == "was killed by signal 200"


def test_log_tail_keeps_the_last_non_empty_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n\n" for i in range(100)) + "x" * 500 + "\n")
    assert log_tail(log, 3) == ["line 98", "line 99", "x" * 200]
    assert log_tail(tmp_path / "missing.log") == []
