"""A stand-in engine process for supervisor tests: `python fake_engine.py PORT MODE`.

MODE `segfault`: kill itself with SIGSEGV at once (a crash while starting). `serve-once`:
answer one HTTP request (the supervisor's health probe) with 200, then kill itself with
SIGSEGV, as a native llama.cpp build does on its first inference on a CPU with AMX.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        print(format % args, flush=True)


def main(port: int, mode: str) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files from the crash
    print(f"fake engine on port {port}, mode {mode}", flush=True)
    if mode == "serve-once":
        with HTTPServer(("127.0.0.1", port), _Ok) as server:
            server.handle_request()
    os.kill(os.getpid(), signal.SIGSEGV)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
