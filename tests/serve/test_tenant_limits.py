"""A tenant's request rates and token budgets (`serve/limits.py`) on a fake clock: exact counts,
the refusal that names the limit and when it resets, reservations settled by real use. (The
edge's limits on clients' connections are in test_limits.py.)"""

from __future__ import annotations

import json

import pytest

from gpuplane.config import parse_settings
from gpuplane.errors import ConfigError
from gpuplane.serve.limits import (
    Account,
    Usage,
    asked_tokens,
    estimated_completion,
    reported_usage,
    streamed_usage,
)
from gpuplane.serve.settings import LimitConfig


def account(**limit: float) -> Account:
    return Account("team-a", [LimitConfig.model_validate(limit)])


def test_a_request_rate_admits_exactly_the_limit_per_window_then_refuses_until_it_resets() -> None:
    acct = account(requests=3, window_s=60)
    now = 120.0 + 50  # 10 s before the window [120, 180) ends
    for _ in range(3):
        assert acct.check(0, now) is None
        acct.admit(0, now)
    refusal = acct.check(0, now)
    assert refusal is not None
    assert (refusal.kind, refusal.limit, refusal.counted, refusal.retry_after_s) == (
        "requests",
        3,
        3,
        10,
    )
    assert refusal.code == "rate_limit_exceeded"
    assert refusal.message() == (
        "tenant 'team-a' made its 3 requests per 60 s; the window resets in 10 s"
    )
    assert acct.check(0, 179.9) is not None
    assert acct.check(0, 180.0) is None  # the next window
    assert acct.usage.requests == 3


def test_a_token_budget_counts_reservations_of_requests_in_flight_then_their_real_use() -> None:
    acct = account(tokens=100, window_s=60)
    first = acct.admit(40, 0.0)
    second = acct.admit(40, 0.0)
    refusal = acct.check(40, 1.0)  # 80 reserved: 40 more would pass 100
    assert refusal is not None
    assert refusal.code == "token_budget_exceeded"
    assert "used or reserved 80 of its 100 tokens per 60 s" in refusal.message()
    assert acct.check(20, 1.0) is None
    first.settle(5, 5, estimated=False, slot_s=0.5, now=2.0)  # used 10 of the 40 it reserved
    first.settle(5, 5, estimated=False, slot_s=0.5, now=2.0)  # a second settle: nothing
    assert acct.check(50, 2.0) is None  # 10 used + 40 reserved + 50 = 100
    assert acct.check(51, 2.0) is not None
    second.settle(30, 20, estimated=True, slot_s=1.5, now=3.0)
    window = acct.windows[0]
    assert (window.used, window.reserved) == (60, 0)
    usage = acct.usage
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (2, 35, 25)
    assert (usage.estimated_prompt_tokens, usage.estimated_completion_tokens) == (30, 20)
    assert usage.slot_seconds == 2.0


def test_requests_in_flight_keep_their_reservation_into_the_next_window() -> None:
    acct = account(tokens=100, window_s=10)
    charge = acct.admit(70, 9.0)
    assert acct.check(40, 11.0) is not None  # a new window, but 70 are still reserved
    charge.settle(20, 10, estimated=False, slot_s=2.0, now=11.0)
    window = acct.windows[0]
    assert (window.start, window.used, window.reserved) == (10.0, 30, 0)
    assert acct.check(70, 11.0) is None


def test_a_request_larger_than_the_whole_budget_is_told_to_ask_for_less() -> None:
    refusal = account(tokens=100).check(150, 0.0)
    assert refusal is not None
    assert "up to 150 tokens" in refusal.message()
    assert "lower max_tokens" in refusal.message()


def test_every_limit_is_checked_and_a_refused_request_counts_toward_none() -> None:
    acct = Account(
        "t",
        [LimitConfig(requests=10, window_s=60), LimitConfig(requests=2, tokens=50, window_s=1)],
    )
    acct.admit(10, 0.0)
    acct.admit(10, 0.0)
    refusal = acct.check(10, 0.5)
    assert refusal is not None
    assert (refusal.kind, refusal.window_s) == ("requests", 1)
    acct.refused(refusal)
    assert [w.used for w in acct.windows] == [2, 2, 0]
    assert acct.usage.limited == {"requests": 1}
    assert acct.check(10, 1.0) is None  # the 1 s window rolled; the 60 s one holds 2 of 10


def test_the_usage_state_shows_each_window_with_what_it_counted_and_when_it_resets() -> None:
    acct = account(requests=5, window_s=60)
    acct.admit(0, 30.0)
    state = acct.state(45.0)
    assert state["limits"] == [
        {
            "kind": "requests",
            "limit": 5,
            "window_s": 60,
            "used": 1,
            "reserved": 0,
            "resets_in_s": 15.0,
        }
    ]
    assert state["requests"] == 1


def test_a_request_may_use_its_prompt_s_estimate_plus_its_max_tokens() -> None:
    chat = {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 7}
    # the prompt's text is "user\x1f" + 40 characters + "\x1e": 46 characters, 12 tokens
    assert asked_tokens(chat) == 12 + 7
    assert asked_tokens({"prompt": "abcd", "max_completion_tokens": 3}) == 1 + 3
    assert asked_tokens({"prompt": "abcd"}) == 1


def test_usage_is_read_from_a_body_or_the_stream_event_that_carries_it() -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    body = json.dumps({"choices": [{"message": {"content": "hello"}}], "usage": usage})
    assert reported_usage(body.encode()) == Usage(11, 4, cached=None)
    events = (
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
        b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n"
        b"data: [DONE]\n\n"
    )
    assert streamed_usage(events) == Usage(11, 4, cached=None)
    assert streamed_usage(b'data: {"choices":[]}\n\n') is None
    assert reported_usage(b'{"usage": null}') is None
    assert reported_usage(b'{"usage": {"prompt_tokens": "3"}}') is None


def test_the_prompt_tokens_an_engine_s_cache_served_are_read_where_it_reports_them() -> None:
    usage = {"prompt_tokens": 500, "completion_tokens": 8, "prompt_tokens_details": {}}
    assert reported_usage(json.dumps({"usage": usage}).encode()) == Usage(500, 8, cached=None)
    usage["prompt_tokens_details"] = {"cached_tokens": 480}  # vLLM's and SGLang's field
    assert reported_usage(json.dumps({"usage": usage}).encode()) == Usage(500, 8, cached=480)
    usage["prompt_tokens_details"] = {"cached_tokens": "480"}
    assert reported_usage(json.dumps({"usage": usage}).encode()) == Usage(500, 8, cached=None)
    assert estimated_completion(b'{"choices": [{"message": {"content": "12345678"}}]}') == 2
    assert estimated_completion(b'{"choices": [{"text": "123"}]}') == 1
    assert estimated_completion(b"not json") == 0


@pytest.mark.parametrize(
    ("tenant", "needle"),
    [
        ({"name": "a", "limits": [{"window_s": 60}]}, "needs `requests`, `tokens` or both"),
        ({"name": "a", "key_sha256": ["abc"]}, "is not a SHA-256 hex digest"),
        ({"name": "a", "limits": [{"requests": 0}]}, "greater than or equal to 1"),
    ],
)
def test_a_wrong_tenant_setting_says_what_to_write(tenant: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_settings({"tenants": [tenant]})


def test_an_admin_key_cannot_also_be_a_tenant_s() -> None:
    digest = "ab" * 32
    with pytest.raises(ConfigError, match="both a tenant's and an admin key"):
        parse_settings(
            {
                "gateway": {"admin": {"key_sha256": [digest]}},
                "tenants": [{"name": "a", "key_sha256": [digest.upper()]}],
            }
        )
