"""What a proxied request used, counted as it runs, and the tenant's charge settled with it.

The engine's `usage` where its answer has one, else an estimate (the prompt at 4 characters a
token; a streamed answer at one token per chunk the engine sent), and the seconds it held
slots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplane.serve.limits import Charge, Usage, estimate_tokens
from gpuplane.serve.prefix import prompt_text


class Consumption:
    """A request's usage so far: the engine's report, the chunks (or estimated tokens) it sent,
    the seconds it held slots."""

    __slots__ = ("events", "reported", "slot_s", "usage_asked")

    def __init__(self, parsed: Mapping[str, Any], stream: bool) -> None:
        self.reported: Usage | None = None  # what the engine says the request used
        self.events = 0  # chunks streamed, or a whole answer's estimated tokens
        # engines put `usage` in a stream only when the client asks
        options = parsed.get("stream_options") if stream else None
        self.usage_asked = isinstance(options, dict) and options.get("include_usage") is True
        self.slot_s = 0.0

    def settle(
        self, charge: Charge, parsed: Mapping[str, Any], stream: bool, status: int, now: float
    ) -> None:
        """Charge the tenant what the request used: the engine's count, else an estimate when
        the engine answered (`status` 200), else nothing."""
        if self.reported is not None:
            prompt, completion, estimated = self.reported.prompt, self.reported.completion, False
        elif status == 200:
            prompt, estimated = estimate_tokens(prompt_text(parsed)), True
            completion = max(0, self.events - 1) if stream else self.events  # [DONE]
        else:
            prompt, completion, estimated = 0, 0, False
        charge.settle(prompt, completion, estimated=estimated, slot_s=self.slot_s, now=now)
