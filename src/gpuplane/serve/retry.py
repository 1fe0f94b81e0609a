"""The retry decision after a failed attempt on an instance: pure, so the rule is tested alone.

A request may run again elsewhere only while nothing of its answer reached the client (else the
client would get two answers spliced); a refused connection uses up no retry."""

from __future__ import annotations

import enum

from gpuplane.serve.errors import FailureKind


class Next(enum.Enum):
    """What a request does after an attempt on an instance failed."""

    RETRY = "retry"  # nothing reached the client: the same request goes to another instance
    ENDED = "ended"  # the answer had begun: it was ended with an error event, never cut silently
    GIVE_UP = "give up"  # nothing reached the client and no retry is left: a 502


def after_failure(kind: FailureKind, answered: bool, retries_left: int) -> tuple[Next, int]:
    """The step after a failed attempt, and the retries left then. Pure.

    `answered`: a byte of the answer was sent to the client, so the request cannot be re-run
    elsewhere (the client would get two answers spliced). A refused connection uses up no
    retry: nothing reached an engine (an engine killed before the request arrived)."""
    if answered:
        return Next.ENDED, retries_left
    if kind is FailureKind.CONNECT:
        return Next.RETRY, retries_left
    if retries_left <= 0:
        return Next.GIVE_UP, 0
    return Next.RETRY, retries_left - 1
