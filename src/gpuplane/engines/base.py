"""The engine adapter interface and the registry of adapters by name.

An adapter knows one engine's conventions: how to launch it for a model on a slice, which path
answers health probes, how to read its running/waiting load from its metrics, and its capacity.
It does no I/O itself; the gateway's prober and the deployment layer do, and hand it text.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuplane.errors import ConfigError, unknown_name
from gpuplane.resources import Slice


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine says about itself in its metrics."""

    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None  # 0..1


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """A process to start: argv plus extra environment."""

    argv: list[str]
    env: dict[str, str]


class EngineAdapter:
    """Base of every engine adapter; subclasses override the class attributes and methods."""

    name: ClassVar[str] = ""
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str] = "/metrics"
    default_capacity: ClassVar[int] = 1
    # How long a request may wait for the busy instance that holds its prompt prefix before it
    # takes another one: worth more where a cold prefill is slow (CPU engines).
    locality_wait_s: ClassVar[float] = 0.0
    # True when the engine's prefix cache saves one state per request (llama.cpp) instead of
    # sharing blocks between requests (vLLM, SGLang): the prefix index models its evictions.
    prefix_cache_per_request: ClassVar[bool] = False
    info_path: ClassVar[str | None] = None  # JSON read by `parse_capacity`, if the engine has one
    # True when the engine's server ends a stream with its `usage` when the client asks
    # (`stream_options.include_usage`: vLLM, SGLang, LMDeploy, TensorRT-LLM, OpenAI); False: its
    # streams never carry it and the gateway counts their tokens as estimated (`/admin/state`).
    stream_usage: ClassVar[bool] = True

    def launch(
        self, model_path: str, host: str, port: int, slice_: Slice, capacity: int | None
    ) -> LaunchSpec:
        """The command that serves `model_path` on host:port within `slice_`, running at most
        `capacity` requests at once (None: the engine's own limit, read back through
        `info_path` and `parse_capacity`)."""
        raise NotImplementedError(f"engine '{self.name}' cannot be launched by gpuplane")

    def parse_load(self, metrics_text: str) -> EngineLoad:
        """Running/waiting counts from the engine's metrics page; unknown fields stay None."""
        return EngineLoad()

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        """The engine's own concurrency limit from the JSON at `info_path`, if it reports one."""
        return None


@dataclass(frozen=True, slots=True)
class LaunchTemplate:
    """How one GPU engine spells its command line; `GpuEngineAdapter.launch` fills it in.

    The command is `command [model_flag] MODEL host_flag HOST port_flag PORT *fixed_flags
    [capacity_flag N] memory_flag F [tensor_parallel_flag G]`, then the user's extra arguments;
    without a capacity the engine sizes itself (SGLang from its KV memory, vLLM its default).
    """

    command: tuple[str, ...]  # the program and its subcommand
    capacity_flag: str
    memory_flag: str  # the engine's GPU-memory fraction
    memory_full: float  # the fraction it uses of a card it owns (see `memory_fraction`)
    tensor_parallel_flag: str  # passed only when the slice spans more than one card
    model_flag: str | None = None  # the flag before the model path; None: it is positional
    host_flag: str = "--host"
    port_flag: str = "--port"
    fixed_flags: tuple[str, ...] = ()  # always passed, after host and port


class GpuEngineAdapter(EngineAdapter):
    """Base of the GPU engines gpuplane launches (vLLM, SGLang, LMDeploy, TensorRT-LLM).

    A subclass declares its `template`; the command is built here, on the slice's devices."""

    template: ClassVar[LaunchTemplate]

    def __init__(
        self,
        card_mem_mib: int | None = None,
        devices: Sequence[int] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.card_mem_mib = card_mem_mib  # set when the card is shared without HAMi
        self.devices = devices
        self.extra_args = list(extra_args)

    def launch(
        self, model_path: str, host: str, port: int, slice_: Slice, capacity: int | None
    ) -> LaunchSpec:
        t = self.template
        frac = memory_fraction(slice_, self.card_mem_mib, t.memory_full)
        argv = [*t.command, *([t.model_flag] if t.model_flag else []), model_path]
        argv += [t.host_flag, host, t.port_flag, str(port), *t.fixed_flags]
        if capacity is not None:
            argv += [t.capacity_flag, str(capacity)]
        argv += [t.memory_flag, f"{frac:g}"]
        if slice_.gpus > 1:
            argv += [t.tensor_parallel_flag, str(slice_.gpus)]
        return LaunchSpec(argv=argv + self.extra_args, env=gpu_env(slice_, self.devices))


def load_from_samples(
    samples: dict[str, float], running: str, waiting: str, *kv_usage: str
) -> EngineLoad:
    """An `EngineLoad` from Prometheus samples; `kv_usage` names are tried in order."""
    run, wait = samples.get(running), samples.get(waiting)
    kv = next((samples[name] for name in kv_usage if name in samples), None)
    return EngineLoad(
        running=None if run is None else int(run),
        waiting=None if wait is None else int(wait),
        kv_cache_usage=kv,
    )


def gpu_env(slice_: Slice, devices: Sequence[int] | None = None) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` for a slice: the given devices, else the first `gpus` (or one)."""
    if not slice_.is_gpu:
        return {"CUDA_VISIBLE_DEVICES": ""}
    ids = list(devices) if devices is not None else list(range(max(slice_.gpus, 1)))
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ids)}


def memory_fraction(slice_: Slice, card_mem_mib: int | None, full: float) -> float:
    """An engine's GPU-memory fraction flag for a slice.

    `full` is what the engine would use of a card it owns. Under HAMi the engine sees only its
    slice's memory, so `full` applies as is (pass `card_mem_mib=None`); on a card the engine shares
    without virtualisation, the fraction shrinks by the slice's share of the card.
    """
    if not slice_.is_fractional or card_mem_mib is None:
        return full
    return round(full * slice_.share(card_mem_mib), 4)


def prometheus_samples(text: str) -> dict[str, float]:
    """Sample name → value summed over its label sets, from Prometheus text (for `parse_load`).

    Summing is what a load reading wants: an engine with several model or engine labels reports
    its total. Unparseable text raises `ValueError` with the parser's reason.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


_REGISTRY: dict[str, Callable[[], EngineAdapter]] = {}
_BUILTIN = ("llamacpp", "vllm", "sglang", "lmdeploy", "trtllm", "sim", "openai")


def register(cls: type[EngineAdapter]) -> type[EngineAdapter]:
    """Class decorator: make an adapter available under `cls.name`."""
    _REGISTRY[cls.name] = cls
    return cls


def adapter_class(name: str) -> Callable[[], EngineAdapter]:
    """The adapter registered as `name`; an unknown name fails with the nearest and the valid ones.

    The settings call it when they are parsed, so `gpuplane config check` refuses what a server
    would refuse."""
    if name not in _REGISTRY and name in _BUILTIN:
        with contextlib.suppress(ModuleNotFoundError):
            importlib.import_module(f"gpuplane.engines.{name}")
    if name not in _REGISTRY:
        raise ConfigError(unknown_name("engine", name, set(_REGISTRY) | set(_BUILTIN)))
    return _REGISTRY[name]


def get_adapter(name: str) -> EngineAdapter:
    """A fresh adapter of the engine registered as `name` (see `adapter_class`)."""
    return adapter_class(name)()
