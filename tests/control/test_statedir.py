"""`statedir.exclusive`: one process holds a state dir; a dead one's lock blocks nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuplane.control.statedir import StateDirInUse, exclusive
from gpuplane.errors import ConfigError

HOLD = """
import sys, time
from gpuplane.control.statedir import exclusive
with exclusive(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_held_dir_is_refused_naming_its_holder_until_the_holder_is_killed(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with (
            pytest.raises(
                StateDirInUse, match=f"in use by another gpuplane process \\(pid {holder.pid}: "
            ),
            exclusive(str(state)),
        ):
            pass
        os.kill(holder.pid, signal.SIGKILL)  # no release: the kernel drops the lock
        holder.wait(30)
        assert (state / "lock").read_text().startswith(f"pid {holder.pid}: ")  # stale
        with exclusive(str(state)):
            assert (state / "lock").read_text().startswith(f"pid {os.getpid()}: ")
        assert (state / "lock").read_text() == ""  # released, with its holder's name
        with exclusive(str(state)):
            pass  # and taken again
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_a_state_dir_that_cannot_be_made_says_what_to_set(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with (
        pytest.raises(ConfigError, match=r"set control\.state_dir"),
        exclusive(str(tmp_path / "a-file" / "state")),
    ):
        pass
