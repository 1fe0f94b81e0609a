"""A swarm of slow clients for the gateway's edge tests, run as a child process so that its
sockets count against its own open-file limit, not the gateway's:

    python -m tests.serve.slow_clients HOST PORT COUNT {head,body} EVERY_S GIVE_UP_S

Opens COUNT connections, then on each sends one byte of a request head every EVERY_S seconds
(`head`: a slowloris), or a whole head and then one byte of its body every EVERY_S seconds
(`body`), and never finishes. Prints one JSON line once every connection is open, and a summary
line once the gateway closed them all or GIVE_UP_S seconds later: how many were opened, closed
by the gateway, and answered 408, and the first answer's start.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from typing import Any

BATCH = 200  # connections opened at once
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"


async def trickle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bool, every_s: float
) -> bytes | None:
    """Trickle until the gateway closes the connection; what it answered (None: never closed,
    the caller cancels)."""
    if body:
        writer.write(HEAD + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    else:
        writer.write(HEAD)
    answer = b""
    while True:
        writer.write(b"{" if body else b"X")
        try:
            data = await asyncio.wait_for(reader.read(65536), every_s)
        except TimeoutError:
            continue
        except ConnectionError:
            return answer
        if not data:
            return answer
        answer += data


async def swarm(
    host: str, port: int, count: int, body: bool, every_s: float, give_up_s: float
) -> dict[str, Any]:
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    tasks: list[asyncio.Task[bytes | None]] = []
    failed = 0
    for start in range(0, count, BATCH):
        opened = await asyncio.gather(
            *(asyncio.open_connection(host, port) for _ in range(start, min(count, start + BATCH))),
            return_exceptions=True,
        )
        for result in opened:
            if isinstance(result, BaseException):
                failed += 1
                continue
            streams.append(result)
            tasks.append(asyncio.create_task(trickle(*result, body, every_s)))
    print(json.dumps({"opened": len(streams), "failed": failed}), flush=True)
    done, pending = await asyncio.wait(tasks, timeout=give_up_s)
    for task in pending:
        task.cancel()
    for _, writer in streams:
        writer.close()
    answers = [task.result() or b"" for task in done]
    return {
        "opened": len(streams),
        "failed": failed,
        "closed": len(done),
        "answered_408": sum(a.startswith(b"HTTP/1.1 408") for a in answers),
        "first_answer": answers[0].decode("latin-1") if answers else "",
    }


def main() -> None:
    host, port, count, mode, every_s, give_up_s = sys.argv[1:]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    summary = asyncio.run(
        swarm(host, int(port), int(count), mode == "body", float(every_s), float(give_up_s))
    )
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
