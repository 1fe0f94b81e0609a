"""`gpuplane control serve`, forked on demand from a process that imported it once, so a test
can kill and restart the real service many times at the cost of a fork, not a second of imports.

    python tests/control/serve_fork.py LOG [serve options...]

Each line on stdin forks a child that runs the real command (`control serve` with the options
given), its output appended to LOG, and answers the child's pid on stdout. End of file on stdin
ends this process; its children are the caller's to stop.
"""

from __future__ import annotations

import os
import sys

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # no threads may run when this process forks

import uvicorn  # noqa: F401 - what the command imports, loaded once here

from gpuplane import plane  # noqa: F401 - the same (the app it serves)
from gpuplane.cli.main import app
from gpuplane.control.service import service  # noqa: F401 - the same


def main(log: str, args: list[str]) -> None:
    for _ in sys.stdin:
        while True:  # reap the children killed since the last start
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        pid = os.fork()
        if pid == 0:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            try:
                app(["control", "serve", *args], standalone_mode=False)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
