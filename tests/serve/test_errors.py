"""An engine's own refusal of a request, read from each engine's error format."""

from __future__ import annotations

import pytest

from gpuplane.serve.errors import engine_error_body


@pytest.mark.parametrize(
    ("raw", "code", "param", "message"),
    [
        (  # vLLM before 0.10, flat
            b'{"object":"error","message":"too long","type":"BadRequestError","param":null,'
            b'"code":400}',
            "upstream_invalid_request",
            None,
            "too long",
        ),
        (  # OpenAI's and newer vLLM's, wrapped
            b'{"error":{"message":"bad n","type":"invalid_request_error","param":"n",'
            b'"code":"invalid_value"}}',
            "invalid_value",
            "n",
            "bad n",
        ),
        (b'{"error":"context overflow"}', "upstream_invalid_request", None, "context overflow"),
        (  # FastAPI's validation errors (llama-cpp-python's server)
            b'{"detail":[{"loc":["body","n"],"msg":"Input should be 1","type":"x"}]}',
            "upstream_invalid_request",
            None,
            "Input should be 1",
        ),
        (b"Bad Request", "upstream_invalid_request", None, "Bad Request"),
    ],
)
def test_engine_error_bodies_are_read_in_each_engines_format(
    raw: bytes, code: str, param: str | None, message: str
) -> None:
    err = engine_error_body(422, raw)["error"]
    assert (err["code"], err["param"], err["type"]) == (code, param, "invalid_request_error")
    assert err["message"] == f"the engine refused the request (HTTP 422): {message}"
