"""The simulator's pure model (`engines/sim/model.py`): admission, FIFO waiting, prefix cache,
faults, determinism."""

from __future__ import annotations

import random

import pytest

from gpuplane.engines.sim.cache import PrefixCache, block_hashes
from gpuplane.engines.sim.model import (
    CHARS_PER_TOKEN,
    Fault,
    InstanceCore,
    SimParams,
    count_tokens,
)


def core(**kw: object) -> InstanceCore:
    params = SimParams(**{"max_num_seqs": 2, **kw})  # type: ignore[arg-type]
    return InstanceCore(params, random.Random(0))


def test_tokens_are_four_characters_rounded_up() -> None:
    assert count_tokens("") == 0
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2


def test_at_most_max_num_seqs_run_and_the_rest_wait_in_arrival_order() -> None:
    c = core()
    a, b, x, y = (c.arrive(f"prompt {i}", 4, now=0.0) for i in range(4))
    assert [r.admitted_at for r in (a, b)] == [0.0, 0.0]
    assert x.admitted_at is None
    assert y.admitted_at is None
    assert c.stats.max_running_seen == 2
    assert c.stats.max_in_flight_seen == 4

    assert c.release(b, now=1.5, completed=True) == [x]
    assert c.release(a, now=2.0, completed=True) == [y]
    assert len(c.running) == 2
    assert not c.waiting
    assert c.stats.requests_waited == 2
    assert c.stats.waiting_time_total_s == pytest.approx(1.5 + 2.0)
    assert c.stats.max_running_seen == 2


def test_release_is_idempotent_and_frees_a_waiter_that_leaves() -> None:
    c = core(max_num_seqs=1)
    a = c.arrive("a", 1, now=0.0)
    b = c.arrive("b", 1, now=0.0)
    assert c.release(b, now=0.1, completed=False) == []  # left while waiting
    assert not c.waiting
    assert c.release(a, now=0.2, completed=True) == []
    assert c.release(a, now=0.3, completed=True) == []
    assert (c.stats.requests_completed, c.stats.requests_aborted) == (1, 1)
    assert not c.running


def test_shared_prefix_hits_the_cache_block_by_block() -> None:
    c = core()
    block = c.block_chars
    system = "s" * (10 * block)
    first = c.arrive(system + "question one", 1, now=0.0)
    assert first.cached_tokens == 0
    c.prefilled(first)
    second = c.arrive(system + "another question", 1, now=0.0)
    assert second.cached_tokens == 10 * c.params.block_tokens
    assert c.prefill_seconds(second) < c.prefill_seconds(first)
    assert c.stats.prefix_hit_tokens == second.cached_tokens
    assert c.stats.prefill_tokens == first.prompt_tokens + second.prompt_tokens - 160


def test_a_prefix_only_counts_once_its_prefill_has_ended() -> None:
    c = core(max_num_seqs=4)
    prompt = "p" * (4 * c.block_chars)
    first = c.arrive(prompt, 1, now=0.0)
    second = c.arrive(prompt, 1, now=0.0)  # first's prefill is not done yet
    assert second.cached_tokens == 0
    c.prefilled(first)
    third = c.arrive(prompt, 1, now=0.0)
    assert third.cached_tokens == 4 * c.params.block_tokens


def test_prefix_cache_is_a_bounded_lru() -> None:
    cache = PrefixCache(capacity_blocks=4)
    a = block_hashes("a" * 64 * 3, 64)
    b = block_hashes("b" * 64 * 3, 64)
    cache.insert(a)
    assert cache.match(a) == 3
    cache.insert(b)
    assert len(cache) == 4
    assert cache.match(b) == 3
    assert cache.match(a) == 0  # a's first block was least recently used and went first


def serve(c: InstanceCore, prompt: str) -> int:
    """Arrive, prefill and complete one request; its cached tokens."""
    req = c.arrive(prompt, 1, now=0.0)
    c.prefilled(req)
    c.release(req, now=0.0, completed=True)
    return req.cached_tokens


def test_a_llama_cpp_cache_keeps_only_its_last_prompt_by_default() -> None:
    c = core(cache_kind="prompts")
    a, b = "a" * (8 * c.block_chars), "b" * (8 * c.block_chars)
    assert serve(c, a + " one") == 0
    assert serve(c, a + " two") == 8 * c.params.block_tokens  # the last prompt's prefix
    assert serve(c, b) == 0
    assert serve(c, a + " three") == 0  # b replaced a: one prompt state only
    assert len(c.cache) == 1


def test_a_llama_cpp_cache_with_cache_keeps_n_prompts_least_recently_used_out() -> None:
    c = core(cache_kind="prompts", cache_prompts=2)
    a, b, d = ("a" * (6 * c.block_chars), "b" * (6 * c.block_chars), "d" * (6 * c.block_chars))
    serve(c, a)
    serve(c, b)
    assert serve(c, a) == 6 * c.params.block_tokens  # a is touched: b is now the oldest
    serve(c, d)
    assert serve(c, a) == 6 * c.params.block_tokens
    assert serve(c, b) == 0
    assert len(c.cache) == 2


def test_block_hashes_chain_so_only_leading_blocks_match() -> None:
    x = block_hashes("A" * 64 + "B" * 64, 64)
    y = block_hashes("C" * 64 + "B" * 64, 64)
    assert x[1] != y[1]
    assert len(block_hashes("A" * 100, 64)) == 1  # a partial block is not cached


def test_itl_grows_with_running_sequences_and_slowdown() -> None:
    c = core(max_num_seqs=4, itl_ms=10.0, itl_growth=0.5, slowdown=3.0)
    c.arrive("a", 1, now=0.0)
    one = c.itl_seconds()
    c.arrive("b", 1, now=0.0)
    assert one == pytest.approx(0.03)
    assert c.itl_seconds() == pytest.approx(0.045)
    assert core(zero_delay=True).itl_seconds() == 0.0


def test_faults_follow_the_rates_and_the_seed() -> None:
    def draws(seed: int) -> list[Fault]:
        c = InstanceCore(
            SimParams(max_num_seqs=100, error_rate=0.2, hang_rate=0.2, drop_rate=0.2),
            random.Random(seed),
        )
        return [c.arrive("x", 1, now=0.0).fault for _ in range(200)]

    first = draws(7)
    assert first == draws(7)
    assert first != draws(8)
    assert {f.value for f in first} == {"none", "error", "hang", "drop"}


def test_an_injected_error_never_takes_a_place() -> None:
    c = InstanceCore(SimParams(max_num_seqs=1, error_rate=1.0), random.Random(0))
    req = c.arrive("x", 1, now=0.0)
    assert req.fault is Fault.ERROR
    assert req.done
    assert not c.running
    assert not c.waiting
    assert c.stats.injected_errors == 1


def test_kill_forgets_everything_but_the_counters() -> None:
    c = core(max_num_seqs=1)
    a = c.arrive("a" * CHARS_PER_TOKEN * 64, 1, now=0.0)
    c.prefilled(a)
    c.arrive("b", 1, now=0.0)
    assert len(c.kill()) == 2
    assert not c.running
    assert not c.waiting
    assert len(c.cache) == 0
    assert c.stats.kills == 1
    assert c.stats.max_running_seen == 1
    assert c.release(a, now=1.0, completed=True) == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"error_rate": 1.5}, "error_rate"),
        ({"error_rate": 0.6, "hang_rate": 0.6}, "must not exceed 1"),
        ({"slowdown": 0}, "slowdown"),
    ],
)
def test_invalid_parameters_say_what_is_wrong(kw: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimParams(**{"max_num_seqs": 1, **kw})  # type: ignore[arg-type]
