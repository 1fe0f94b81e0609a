"""The engine simulator's pure model: admission, FIFO waiting, an LRU prefix cache and latencies.

One `InstanceCore` models one engine instance the way vLLM behaves under load: at most
`max_num_seqs` sequences run at once and the rest wait inside the engine in arrival order; time to
first token is the wait plus a prefill proportional to the prompt tokens that are not in the
instance's prefix cache; inter-token latency grows with the number of running sequences.

Tokenisation is approximate and documented: one token per `CHARS_PER_TOKEN` (4) characters of the
prompt text, rounded up. The prefix cache is block-granular like vLLM's: a block is
`block_tokens` tokens (64 characters by default), identified by a hash chained over every block
before it, so only whole leading blocks of a shared prefix hit. Its kind is the engine's
(`cache_kind`): `blocks`, vLLM's and SGLang's, an LRU of blocks bounded by `prefix_cache_tokens`;
or `prompts`, llama.cpp's server, which keeps the state of whole prompts: its last one only by
default, `cache_prompts` of them with `--cache` (a hit is the longest shared prefix of one kept
prompt).

No I/O and no clock reads: the HTTP shell (`server.py`, `instance.py`) hands in `now` and owns
the `random.Random` seeded from the simulator's seed, so runs are deterministic for a seed. The
`/metrics` text is rendered from an `InstanceCore` by `metrics.py`; the two kinds of prefix cache
are `cache.py`'s.
"""

from __future__ import annotations

import contextlib
import enum
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from gpuplane.engines.sim.cache import Cache, PrefixCache, PromptCache, block_hashes

CHARS_PER_TOKEN = 4


def count_tokens(text: str) -> int:
    """Approximate token count: one token per 4 characters, rounded up."""
    return -(-len(text) // CHARS_PER_TOKEN)


class Fault(enum.Enum):
    """What the failure injection decided for one request."""

    NONE = "none"
    ERROR = "error"  # answer 500 before admission
    HANG = "hang"  # admitted, then never answers
    DROP = "drop"  # the connection is closed after `drop_at_token` tokens


@dataclass(frozen=True, slots=True)
class SimParams:
    """How one simulated instance behaves; every field has a default but capacity."""

    max_num_seqs: int
    prefill_tokens_per_s: float = 50_000.0
    itl_ms: float = 10.0
    itl_growth: float = 0.05  # ITL * (1 + growth * (running - 1))
    slowdown: float = 1.0  # multiplies prefill and ITL (a slower card)
    prefix_cache_tokens: int = 262_144
    block_tokens: int = 16
    # the engine's kind of prefix cache: `blocks` (vLLM, SGLang: a block budget of
    # prefix_cache_tokens) or `prompts` (llama.cpp: the last `cache_prompts` prompts' states)
    cache_kind: Literal["blocks", "prompts"] = "blocks"
    cache_prompts: int = 1
    kv_cache_tokens: int | None = None  # default: max_num_seqs * 4096
    default_max_tokens: int = 16
    tokens_per_chunk: int = 1  # tokens sent per SSE chunk (fewer events in benchmarks)
    zero_delay: bool = False  # no prefill and no ITL: measures the HTTP path alone
    error_rate: float = 0.0
    hang_rate: float = 0.0
    drop_rate: float = 0.0
    drop_at_token: int = 1
    # vLLM's --max-model-len: a longer prompt plus max_tokens is refused with 400 (None: any)
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        checks = (
            (self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}"),
            (self.prefill_tokens_per_s > 0, "prefill_tokens_per_s must be > 0"),
            (self.itl_ms >= 0 and self.itl_growth >= 0, "itl_ms and itl_growth must be >= 0"),
            (self.slowdown > 0, f"slowdown must be > 0, got {self.slowdown}"),
            (self.prefix_cache_tokens >= 0, "prefix_cache_tokens must be >= 0"),
            (self.cache_kind in ("blocks", "prompts"), "cache_kind must be blocks or prompts"),
            (self.cache_prompts >= 0, "cache_prompts must be >= 0"),
            (self.block_tokens >= 1 and self.tokens_per_chunk >= 1, "block/chunk sizes >= 1"),
            (self.default_max_tokens >= 1, "default_max_tokens must be >= 1"),
            (self.drop_at_token >= 0, "drop_at_token must be >= 0"),
            (self.max_model_len is None or self.max_model_len >= 1, "max_model_len must be >= 1"),
        )
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        for name in ("error_rate", "hang_rate", "drop_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within 0..1, got {rate}")
        if self.error_rate + self.hang_rate + self.drop_rate > 1.0:
            raise ValueError("error_rate + hang_rate + drop_rate must not exceed 1")

    @property
    def kv_tokens(self) -> int:
        return self.kv_cache_tokens or self.max_num_seqs * 4096


@dataclass(slots=True)
class SimStats:
    """Counters one instance reports at `GET /sim/stats`; they survive a kill and restart."""

    max_running_seen: int = 0
    max_in_flight_seen: int = 0  # running + waiting: requests the engine held at once
    requests_total: int = 0
    requests_completed: int = 0
    requests_aborted: int = 0  # the client went away first
    requests_waited: int = 0
    waiting_time_total_s: float = 0.0
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefill_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    injected_errors: int = 0
    injected_hangs: int = 0
    injected_drops: int = 0
    kills: int = 0

    def as_dict(self) -> dict[str, int | float]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class SimRequest:
    """One request inside an instance, from arrival to release."""

    rid: int
    arrived: float
    prompt_tokens: int
    max_tokens: int
    hashes: list[int]
    fault: Fault = Fault.NONE
    cached_tokens: int = 0
    admitted_at: float | None = None
    done: bool = False


@dataclass(slots=True)
class InstanceCore:
    """One simulated engine instance: `arrive`, then `release` (idempotent) on every path."""

    params: SimParams
    rng: random.Random
    stats: SimStats = field(default_factory=SimStats)
    running: dict[int, SimRequest] = field(default_factory=dict)
    waiting: deque[SimRequest] = field(default_factory=deque)
    cache: Cache = field(init=False)
    kv_reserved: int = 0
    _next_rid: int = 0

    def __post_init__(self) -> None:
        p = self.params
        if p.cache_kind == "prompts":
            self.cache = PromptCache(p.cache_prompts)
        else:
            self.cache = PrefixCache(p.prefix_cache_tokens // p.block_tokens)

    @property
    def block_chars(self) -> int:
        return self.params.block_tokens * CHARS_PER_TOKEN

    def too_long(self, prompt: str, max_tokens: int | None) -> str | None:
        """vLLM's message refusing a request past `max_model_len`; None when it fits (asked
        before `arrive`)."""
        limit = self.params.max_model_len
        prompt_tokens = count_tokens(prompt)
        completion = max_tokens or self.params.default_max_tokens
        if limit is None or prompt_tokens + completion <= limit:
            return None
        return (
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + completion} tokens ({prompt_tokens} in the messages, {completion} "
            "in the completion). Please reduce the length of the messages or completion."
        )

    def arrive(self, prompt: str, max_tokens: int | None, now: float) -> SimRequest:
        """Register a request; it is running if a sequence slot is free, else waiting (FIFO)."""
        p = self.params
        self._next_rid += 1
        req = SimRequest(
            rid=self._next_rid,
            arrived=now,
            prompt_tokens=count_tokens(prompt),
            max_tokens=max_tokens or p.default_max_tokens,
            hashes=block_hashes(prompt, self.block_chars),
            fault=self._draw_fault(),
        )
        self.stats.requests_total += 1
        if req.fault is Fault.ERROR:
            self.stats.injected_errors += 1
            req.done = True
            return req
        if len(self.running) < p.max_num_seqs and not self.waiting:
            self._admit(req, now)
        else:
            self.waiting.append(req)
        in_flight = len(self.running) + len(self.waiting)
        self.stats.max_in_flight_seen = max(self.stats.max_in_flight_seen, in_flight)
        return req

    def _draw_fault(self) -> Fault:
        p = self.params
        if p.error_rate == p.hang_rate == p.drop_rate == 0.0:
            return Fault.NONE
        x = self.rng.random()
        if x < p.error_rate:
            return Fault.ERROR
        if x < p.error_rate + p.hang_rate:
            self.stats.injected_hangs += 1
            return Fault.HANG
        if x < p.error_rate + p.hang_rate + p.drop_rate:
            self.stats.injected_drops += 1
            return Fault.DROP
        return Fault.NONE

    def _admit(self, req: SimRequest, now: float) -> None:
        req.admitted_at = now
        self.running[req.rid] = req
        self.stats.max_running_seen = max(self.stats.max_running_seen, len(self.running))
        wait = now - req.arrived
        if wait > 0:
            self.stats.requests_waited += 1
            self.stats.waiting_time_total_s += wait
        # the prefix cache is consulted when the sequence is scheduled, as in vLLM
        hit_blocks = self.cache.match(req.hashes)
        req.cached_tokens = min(hit_blocks * self.params.block_tokens, req.prompt_tokens)
        self.stats.prompt_tokens += req.prompt_tokens
        self.stats.prefix_queries += req.prompt_tokens
        self.stats.prefix_hit_tokens += req.cached_tokens
        self.stats.prefill_tokens += req.prompt_tokens - req.cached_tokens
        self.kv_reserved += req.prompt_tokens + req.max_tokens

    def prefill_seconds(self, req: SimRequest) -> float:
        """Prefill time of an admitted request: its uncached prompt tokens at the prefill rate."""
        p = self.params
        if p.zero_delay:
            return 0.0
        return (req.prompt_tokens - req.cached_tokens) / p.prefill_tokens_per_s * p.slowdown

    def prefilled(self, req: SimRequest) -> None:
        """The prompt's blocks are computed: later requests sharing the prefix hit them."""
        self.cache.insert(req.hashes)

    def itl_seconds(self) -> float:
        """Time per generated token now, growing with the number of running sequences."""
        p = self.params
        if p.zero_delay or p.itl_ms == 0:
            return 0.0
        extra = max(len(self.running) - 1, 0)
        return p.itl_ms / 1000.0 * p.slowdown * (1.0 + p.itl_growth * extra)

    def generated(self, tokens: int) -> None:
        self.stats.generation_tokens += tokens

    def release(self, req: SimRequest, now: float, *, completed: bool) -> list[SimRequest]:
        """Free the request's place (idempotent); returns the waiters admitted in its stead."""
        if req.done:
            return []
        req.done = True
        if completed:
            self.stats.requests_completed += 1
        else:
            self.stats.requests_aborted += 1
        if self.running.pop(req.rid, None) is not None:
            self.kv_reserved -= req.prompt_tokens + req.max_tokens
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        admitted: list[SimRequest] = []
        while self.waiting and len(self.running) < self.params.max_num_seqs:
            nxt = self.waiting.popleft()
            self._admit(nxt, now)
            admitted.append(nxt)
        return admitted

    def kill(self, count: bool = True) -> list[SimRequest]:
        """The engine died (or stopped): every request it held is gone, and so is its cache."""
        lost = [*self.running.values(), *self.waiting]
        for req in lost:
            req.done = True
        self.stats.requests_aborted += len(lost)
        self.stats.kills += int(count)
        self.running.clear()
        self.waiting.clear()
        self.cache.clear()
        self.kv_reserved = 0
        return lost

    def kv_usage(self) -> float:
        return min(1.0, self.kv_reserved / self.params.kv_tokens)

    def output_token(self, req: SimRequest, i: int, seed: int) -> str:
        """The i-th generated token: a fixed function of the seed, the prompt length and i."""
        return _VOCAB[(seed * 7919 + req.prompt_tokens * 31 + i * 17) % len(_VOCAB)]


_WORDS = (
    "the slot lease holds until the whole generation ends and then goes back to the pool "
    "while waiting requests move forward in order so that no engine runs more than it can"
)
_VOCAB = tuple(f" {w}" for w in _WORDS.split())
