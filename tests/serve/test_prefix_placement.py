import random

import pytest

from gpuplane.errors import ConfigError
from gpuplane.serve.placement import SlotsPolicy, SlotsWithoutPrefixPolicy, make_policy
from gpuplane.serve.prefix import PrefixIndex, block_hashes, prompt_text
from gpuplane.serve.slots import InstanceSlots

SYSTEM = "You are a careful assistant. " * 20


def chat(system: str, question: str) -> list[int]:
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]
    }
    return block_hashes(prompt_text(body), 16)


def test_shared_prefix_shares_leading_blocks() -> None:
    a = chat(SYSTEM, "what is 2+2? " * 4)
    b = chat(SYSTEM, "name a colour " * 4)
    shared = len(SYSTEM) // 16
    assert a[:shared] == b[:shared]
    assert a[shared + 1 :] != b[shared + 1 :]
    assert chat("other " * 40, "what is 2+2?")[0] != a[0]


def test_prompt_text_covers_content_parts_and_completions() -> None:
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert "hello" in prompt_text(parts)
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["abc", "def"]}) == "abc\x1edef"


def test_index_matches_the_longest_prefix_per_instance() -> None:
    idx = PrefixIndex(max_blocks=1000)
    a = chat(SYSTEM, "q1")
    idx.record(a, "i1")
    other = chat(SYSTEM[: len(SYSTEM) // 2] + "x" * 400, "q2")
    idx.record(other, "i2")
    q3 = chat(SYSTEM, "q3")
    match = idx.match(q3)
    assert match["i1"] > match.get("i2", 0) > 0
    assert [idx.depth_on(q3, i) for i in ("i1", "i2", "i3")] == [match["i1"], match["i2"], 0]


def test_index_is_bounded_and_forgets_instances() -> None:
    idx = PrefixIndex(max_blocks=10)
    idx.record(chat(SYSTEM, "q"), "i1")
    assert len(idx) == 10
    idx.forget("i1")
    assert len(idx) == 0
    assert idx.match(chat(SYSTEM, "q")) == {}


def inst(iid: str, in_flight: int, capacity: int = 4) -> InstanceSlots:
    return InstanceSlots(iid, f"http://{iid}", capacity, in_flight)


def test_prefix_affinity_wins_when_not_much_busier() -> None:
    policy = SlotsPolicy(max_imbalance=0.5)
    choice = policy.choose([inst("a", 1), inst("b", 0)], {"a": 10}, random.Random(0))
    assert choice is not None
    assert (choice.instance_id, choice.reason) == ("a", "prefix")


def test_prefix_affinity_yields_to_a_much_less_loaded_instance() -> None:
    policy = SlotsPolicy(max_imbalance=0.5)
    choice = policy.choose([inst("a", 3), inst("b", 0)], {"a": 10}, random.Random(0))
    assert choice is not None
    assert (choice.instance_id, choice.reason) == ("b", "least_loaded")


def test_least_utilised_with_random_ties() -> None:
    policy = SlotsWithoutPrefixPolicy()
    picks = {
        policy.choose([inst("a", 1), inst("b", 1), inst("c", 2)], {}, random.Random(s)).instance_id  # type: ignore[union-attr]
        for s in range(30)
    }
    assert picks == {"a", "b"}
    assert policy.choose([], {}, random.Random(0)) is None


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="slots_prefix"):
        make_policy("slot_prefix", 0.5)


def test_per_instance_bound_forgets_that_instances_oldest_prefix() -> None:
    first, second = chat("A" * 640, "q"), chat("B" * 640, "q")
    idx = PrefixIndex(max_blocks=10_000, blocks_per_instance=len(first) + 2)
    idx.record(first, "i1")
    idx.record(first, "i2")
    idx.record(second, "i1")  # i1's cache holds about one prompt: the first one is gone there
    assert "i1" not in idx.match(first)
    assert idx.match(first)["i2"] == len(first)
    assert idx.match(second)["i1"] == len(second)


def test_forget_prefix_drops_one_instance_only() -> None:
    blocks = chat(SYSTEM, "q")
    idx = PrefixIndex(max_blocks=10_000)
    idx.record(blocks, "i1")
    idx.record(blocks, "i2")
    idx.forget_prefix(blocks, "i1")
    assert idx.match(blocks) == {"i2": len(blocks)}


@pytest.mark.parametrize("per_request_cache", [False, True])
def test_an_evicted_prefix_takes_what_was_used_before_it_along(per_request_cache: bool) -> None:
    # an engine evicts least recently used first: if b is gone from i1, so is a, not c
    a, b, c = (chat(s * 640, "q") for s in "ABC")
    idx = PrefixIndex(10_000, blocks_per_instance=10 * len(a), per_request_cache=per_request_cache)
    for prompt in (a, b, c):
        idx.record(prompt, "i1")
        idx.record(prompt, "i2")
    idx.forget_prefix(b, "i1")
    assert "i1" not in idx.match(a)
    assert "i1" not in idx.match(b)
    assert idx.match(c)["i1"] == len(c)
    assert idx.match(a) == {"i2": len(a)}


def test_per_request_cache_model_evicts_like_llama_cpp() -> None:
    # room for two saved requests; alternating two prompts touches, re-saves and evicts
    t1, t2 = chat("A" * 640, "q"), chat("B" * 640, "q")
    idx = PrefixIndex(max_blocks=10_000, blocks_per_instance=2 * len(t1), per_request_cache=True)
    idx.record(t1, "i")
    idx.record(t2, "i")
    assert idx.match(t1)
    assert idx.match(t2)
    idx.record(t1, "i")  # hit: touches t1's entry, saves another t1 entry, evicts t2
    assert idx.match(t1) == {"i": len(t1)}
    assert idx.match(t2) == {}


@pytest.mark.parametrize("per_request_cache", [False, True])
def test_a_miss_at_a_reuse_distance_bounds_what_the_instance_is_thought_to_keep(
    per_request_cache: bool,
) -> None:
    # the engine keeps one prompt (llama.cpp by default): a, then b, then a misses
    a, b, c = (chat(s * 640, "q") for s in "ABC")
    idx = PrefixIndex(10_000, per_request_cache=per_request_cache)  # told nothing: unbounded
    idx.record(a, "i")
    idx.record(b, "i")
    distance = idx.reuse_distance(a, "i")
    assert distance == len(b)
    idx.record(a, "i")  # placed there as cached
    idx.evicted("i", distance)
    assert idx.capacity("i") == len(b)
    assert idx.match(a) == {"i": len(a)}  # just prefilled: held
    assert idx.match(b) == {}
    idx.record(c, "i")
    assert idx.match(a) == {}  # one prompt's worth, the newest
    assert idx.match(c) == {"i": len(c)}


def test_an_unexpected_hit_grows_what_the_instance_is_thought_to_keep() -> None:
    a, b, c = (chat(s * 640, "q") for s in "ABC")
    idx = PrefixIndex(10_000, blocks_per_instance=len(a))
    idx.record(a, "i")
    idx.record(b, "i")
    assert idx.match(a) == {}
    idx.held(a, "i")  # a came back at cached speed after all
    assert idx.capacity("i") == 2 * len(a)
    idx.record(c, "i")
    assert idx.match(b) == {"i": len(b)}
    assert idx.match(c) == {"i": len(c)}


def test_an_instance_that_keeps_nothing_is_never_predicted_to_hit() -> None:
    a = chat("A" * 640, "q")
    idx = PrefixIndex(10_000)
    idx.record(a, "i")
    distance = idx.reuse_distance(a, "i")
    assert distance == 0
    idx.record(a, "i")
    idx.evicted("i", distance)  # missed right after serving it: no prefix cache at all
    assert idx.match(a) == {}
    idx.record(a, "i")
    assert idx.match(a) == {}
