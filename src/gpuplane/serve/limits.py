"""Per-tenant limits and usage: request rates and token budgets over fixed windows, and what each
tenant used (requests, prompt and completion tokens, slot-seconds).

Pure: the caller passes `now`, in wall-clock seconds, since windows start at multiples of their
length since the Unix epoch (a day's budget resets at 00:00 UTC). Ask, then commit:
`Account.check` returns an `OverLimit` naming the limit and when its window resets; `admit`
counts the request and reserves its tokens; the `Charge` it returns is settled once, when the
request ends, with what it used (a second settle does nothing). The gateway runs on one event
loop and nothing awaits between `check` and `admit`, so concurrent requests are admitted
exactly up to each limit without a lock.

A token budget counts the tokens requests in flight reserved (their prompt's estimate plus their
`max_tokens`) beside the tokens settled in the window. A request settles into the window in which
it ends; a window that rolls over keeps the reservations of the requests still in flight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import orjson

from gpuplane.serve.prefix import prompt_text
from gpuplane.serve.settings import LimitConfig

LimitKind = Literal["requests", "tokens"]
CHARS_PER_TOKEN = 4  # the usual estimate for English text with BPE tokenizers
_CODES: dict[LimitKind, str] = {
    "requests": "rate_limit_exceeded",
    "tokens": "token_budget_exceeded",
}


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def asked_tokens(payload: Mapping[str, Any]) -> int:
    """The most tokens a completion request can use, as far as the gateway can tell before the
    engine answers: its prompt's estimate plus its `max_tokens` (none given: the prompt's)."""
    most = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
    return estimate_tokens(prompt_text(payload)) + (most if isinstance(most, int) else 0)


def estimated_completion(body: bytes) -> int:
    """A completion body's tokens, estimated from the text of its choices."""
    try:
        choices = orjson.loads(body).get("choices")
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    if not isinstance(choices, list):
        return 0
    text = ""
    for choice in choices:
        if isinstance(choice, dict):
            message = choice.get("message")
            content = message.get("content") if isinstance(message, dict) else choice.get("text")
            text += content if isinstance(content, str) else ""
    return estimate_tokens(text)


class Usage(NamedTuple):
    """What the engine says a request used: prompt and completion tokens, and how many of the
    prompt's tokens its prefix cache served (`cached`; None when the engine does not say:
    vLLM reports it with `--enable-prompt-tokens-details`, SGLang with `--enable-cache-report`,
    in the OpenAI field `usage.prompt_tokens_details.cached_tokens`)."""

    prompt: int
    completion: int
    cached: int | None = None


def reported_usage(body: bytes) -> Usage | None:
    """The `usage` object of a completion body (or of one SSE event's data); None when it has
    none with both token counts."""
    try:
        usage = orjson.loads(body).get("usage")
        prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return None
    if not (isinstance(prompt, int) and isinstance(completion, int)):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, completion, cached if isinstance(cached, int) else None)


def streamed_usage(chunk: bytes) -> Usage | None:
    """`reported_usage` of the last SSE event in `chunk` that mentions `usage`."""
    at = chunk.rfind(b'"usage"')
    start = chunk.rfind(b"data:", 0, at) if at >= 0 else -1
    if start < 0:
        return None
    return reported_usage(chunk[start + 5 :].split(b"\n\n", 1)[0])


@dataclass(slots=True)
class LimitWindow:
    """One limit's count in the current fixed window."""

    kind: LimitKind
    limit: int
    length_s: float
    start: float = -math.inf
    used: int = 0
    reserved: int = 0  # tokens reserved by requests in flight (a token budget only)

    def roll(self, now: float) -> None:
        start = math.floor(now / self.length_s) * self.length_s
        if start != self.start:
            self.start, self.used = start, 0

    def resets_in(self, now: float) -> float:
        return self.start + self.length_s - now


@dataclass(frozen=True, slots=True)
class OverLimit:
    """Why a tenant's request is over a limit (answered 429 with `Retry-After`)."""

    tenant: str
    kind: LimitKind
    limit: int
    window_s: float
    counted: int  # used in the window, plus reserved for tokens
    asked: int
    resets_in_s: float

    @property
    def code(self) -> str:
        return _CODES[self.kind]

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.resets_in_s))

    def message(self) -> str:
        per = f"{self.limit} {self.kind} per {self.window_s:g} s"
        resets = f"the window resets in {self.retry_after_s} s"
        if self.kind == "requests":
            return f"tenant '{self.tenant}' made its {per}; {resets}"
        if self.asked > self.limit:
            return (
                f"this request may use up to {self.asked} tokens (its prompt's estimate plus "
                f"max_tokens), more than tenant '{self.tenant}' may use in a window ({per}); "
                "lower max_tokens or shorten the prompt"
            )
        return (
            f"tenant '{self.tenant}' used or reserved {self.counted} of its {per}, and this "
            f"request may use up to {self.asked} more; {resets}"
        )


@dataclass(slots=True)
class TenantUsage:
    """What a tenant used since the gateway started."""

    requests: int = 0  # admitted past its limits
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_prompt_tokens: int = 0  # of prompt_tokens, estimated: the engine reported none
    estimated_completion_tokens: int = 0
    slot_seconds: float = 0.0
    limited: dict[str, int] = field(default_factory=dict)  # requests refused, by limit kind


class Account:
    """One tenant's limits and usage."""

    __slots__ = ("budgets_tokens", "name", "usage", "windows")

    def __init__(self, name: str, limits: Sequence[LimitConfig] = ()) -> None:
        self.name = name
        self.usage = TenantUsage()
        kinds: tuple[LimitKind, ...] = ("requests", "tokens")
        self.windows = [
            LimitWindow(kind, count, limit.window_s)
            for limit in limits
            for kind, count in zip(kinds, (limit.requests, limit.tokens), strict=True)
            if count is not None
        ]
        self.budgets_tokens = any(w.kind == "tokens" for w in self.windows)

    def check(self, tokens: int, now: float) -> OverLimit | None:
        """Would a request that may use `tokens` pass every limit now? The first one it would
        go over, else None."""
        for w in self.windows:
            w.roll(now)
            asked = 1 if w.kind == "requests" else tokens
            if w.used + w.reserved + asked > w.limit:
                return OverLimit(
                    self.name,
                    w.kind,
                    w.limit,
                    w.length_s,
                    w.used + w.reserved,
                    asked,
                    w.resets_in(now),
                )
        return None

    def refused(self, refusal: OverLimit) -> None:
        self.usage.limited[refusal.kind] = self.usage.limited.get(refusal.kind, 0) + 1

    def admit(self, tokens: int, now: float) -> Charge:
        """Count the request and reserve its tokens (after `check` said yes)."""
        for w in self.windows:
            w.roll(now)
            if w.kind == "requests":
                w.used += 1
            else:
                w.reserved += tokens
        self.usage.requests += 1
        return Charge(self, tokens)

    def state(self, now: float) -> dict[str, Any]:
        """`/admin/usage`'s entry: the usage, and each limit's count in its current window."""
        usage = self.usage
        limits = []
        for w in self.windows:
            w.roll(now)
            limits.append(
                {
                    "kind": w.kind,
                    "limit": w.limit,
                    "window_s": w.length_s,
                    "used": w.used,
                    "reserved": w.reserved,
                    "resets_in_s": round(w.resets_in(now), 3),
                }
            )
        return {
            "tenant": self.name,
            "requests": usage.requests,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "estimated_prompt_tokens": usage.estimated_prompt_tokens,
            "estimated_completion_tokens": usage.estimated_completion_tokens,
            "slot_seconds": round(usage.slot_seconds, 6),
            "limited": dict(usage.limited),
            "limits": limits,
        }


@dataclass(slots=True)
class Charge:
    """An admitted request's claim on its tenant's account; `settle` it once when it ends."""

    account: Account
    reserved: int
    settled: bool = False

    def settle(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        estimated: bool,
        slot_s: float,
        now: float,
    ) -> None:
        """Replace the reservation with what the request used (idempotent)."""
        if self.settled:
            return
        self.settled = True
        account = self.account
        for w in account.windows:
            if w.kind == "tokens":
                w.roll(now)
                w.reserved -= self.reserved
                w.used += prompt_tokens + completion_tokens
        usage = account.usage
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        if estimated:
            usage.estimated_prompt_tokens += prompt_tokens
            usage.estimated_completion_tokens += completion_tokens
        usage.slot_seconds += slot_s
