"""Engine adapters: load from each engine's documented metrics, launch commands, capacity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplane.engines import get_adapter
from gpuplane.engines.base import EngineLoad, GpuEngineAdapter
from gpuplane.engines.lmdeploy import LmdeployAdapter, backend_config_labels
from gpuplane.engines.sglang import SglangAdapter
from gpuplane.engines.trtllm import TrtllmAdapter
from gpuplane.engines.vllm import VllmAdapter
from gpuplane.errors import ConfigError
from gpuplane.resources import Slice

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


@pytest.mark.parametrize(
    ("engine", "file", "expected"),
    [
        ("vllm", "vllm_metrics.txt", EngineLoad(running=5, waiting=2, kv_cache_usage=0.42)),
        ("vllm", "vllm_v0_metrics.txt", EngineLoad(running=3, waiting=0, kv_cache_usage=0.07)),
        (
            "sglang",
            "sglang_metrics.txt",
            EngineLoad(running=162, waiting=2826, kv_cache_usage=0.28),
        ),
        ("lmdeploy", "lmdeploy_metrics.txt", EngineLoad(running=7, waiting=2, kv_cache_usage=0.35)),
        ("trtllm", "trtllm_metrics.json", EngineLoad(running=7, waiting=3, kv_cache_usage=0.028)),
        ("trtllm", "trtllm_prometheus.txt", EngineLoad(running=4, waiting=1, kv_cache_usage=0.25)),
    ],
)
def test_load_is_read_from_each_engines_documented_metrics(
    engine: str, file: str, expected: EngineLoad
) -> None:
    load = get_adapter(engine).parse_load(sample(file))
    assert (load.running, load.waiting) == (expected.running, expected.waiting)
    assert load.kv_cache_usage == pytest.approx(expected.kv_cache_usage)


def test_an_engine_without_load_metrics_reports_unknown_not_zero() -> None:
    load = get_adapter("vllm").parse_load(sample("sglang_metrics.txt"))
    assert load == EngineLoad()


def test_vllm_sums_data_parallel_engines() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3\n'
    )
    assert get_adapter("vllm").parse_load(text).running == 5


def test_capacity_comes_from_each_engines_own_setting() -> None:
    assert VllmAdapter().parse_capacity({"max_num_seqs": 48}) == 48
    vllm_config = "model='m', scheduler_config=SchedulerConfig(max_num_seqs=96, ...)"
    assert VllmAdapter().parse_capacity({"vllm_config": vllm_config}) == 96
    assert SglangAdapter().parse_capacity({"max_running_requests": 64}) == 64
    nested: dict[str, object] = {"internal_states": [{"max_running_requests": 32}]}
    assert SglangAdapter().parse_capacity(nested) == 32
    labels = backend_config_labels(sample("lmdeploy_metrics.txt"))
    assert LmdeployAdapter().parse_capacity(labels) == 128
    stats = json.loads(sample("trtllm_metrics.json"))[-1]
    assert TrtllmAdapter().parse_capacity(stats) == 64
    assert VllmAdapter().parse_capacity({"unrelated": 1}) is None


def test_llama_server_reports_its_slots_at_props() -> None:
    # the shape of llama.cpp's `llama-server --parallel 4` answer to GET /props (abridged)
    props: dict[str, object] = {
        "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": -1}},
        "total_slots": 4,
        "model_path": "/models/m.gguf",
        "chat_template": "",
    }
    adapter = get_adapter("llamacpp")
    assert adapter.info_path == "/props"
    assert adapter.parse_capacity(props) == 4
    bad_props: list[dict[str, object]] = [
        {},
        {"total_slots": 0},
        {"total_slots": "4"},
        {"total_slots": True},
    ]
    for bad in bad_props:
        assert adapter.parse_capacity(bad) is None  # llama-cpp-python's server: its default 1


def test_launch_commands_carry_capacity_memory_share_and_devices() -> None:
    half = Slice(gpus=1, gpu_mem_mib=40_960)
    vllm = VllmAdapter(card_mem_mib=81_920, devices=[3]).launch("m", "127.0.0.1", 9000, half, 8)
    assert vllm.argv[:3] == ["vllm", "serve", "m"]
    assert _flag(vllm.argv, "--max-num-seqs") == "8"
    assert _flag(vllm.argv, "--gpu-memory-utilization") == "0.45"
    assert vllm.env == {"CUDA_VISIBLE_DEVICES": "3"}

    sglang = SglangAdapter().launch("m", "127.0.0.1", 9001, Slice(gpus=2), 16)
    assert _flag(sglang.argv, "--max-running-requests") == "16"
    assert _flag(sglang.argv, "--mem-fraction-static") == "0.88"  # HAMi or whole cards
    assert _flag(sglang.argv, "--tp-size") == "2"
    assert sglang.env == {"CUDA_VISIBLE_DEVICES": "0,1"}

    lmdeploy = LmdeployAdapter(card_mem_mib=81_920).launch("m", "0.0.0.0", 9002, half, 4)
    assert _flag(lmdeploy.argv, "--max-batch-size") == "4"
    assert _flag(lmdeploy.argv, "--cache-max-entry-count") == "0.4"
    assert _flag(lmdeploy.argv, "--server-port") == "9002"

    trtllm = TrtllmAdapter().launch("m", "127.0.0.1", 9003, Slice(gpus=1), 32)
    assert _flag(trtllm.argv, "--max_batch_size") == "32"
    assert _flag(trtllm.argv, "--kv_cache_free_gpu_memory_fraction") == "0.9"

    own = SglangAdapter().launch("m", "127.0.0.1", 9001, Slice(gpus=1), None)
    assert "--max-running-requests" not in own.argv  # no capacity: SGLang sizes itself
    assert _flag(own.argv, "--mem-fraction-static") == "0.88"


# The whole command line of each GPU engine, pinned for the three slice shapes gpuplane launches:
# half a shared card (memory fraction scaled, given device, user arguments last), two whole cards
# (tensor parallel) and no card.
LAUNCHES: dict[type[GpuEngineAdapter], tuple[str, str, str]] = {
    VllmAdapter: (
        "vllm serve m --host 127.0.0.1 --port 9000 --max-num-seqs 8"
        " --gpu-memory-utilization 0.45 --seed 1",
        "vllm serve m --host 0.0.0.0 --port 9001 --max-num-seqs 16"
        " --gpu-memory-utilization 0.9 --tensor-parallel-size 2",
        "vllm serve m --host 127.0.0.1 --port 9002 --max-num-seqs 4 --gpu-memory-utilization 0.9",
    ),
    SglangAdapter: (
        "python -m sglang.launch_server --model-path m --host 127.0.0.1 --port 9000"
        " --enable-metrics --max-running-requests 8 --mem-fraction-static 0.44 --seed 1",
        "python -m sglang.launch_server --model-path m --host 0.0.0.0 --port 9001"
        " --enable-metrics --max-running-requests 16 --mem-fraction-static 0.88 --tp-size 2",
        "python -m sglang.launch_server --model-path m --host 127.0.0.1 --port 9002"
        " --enable-metrics --max-running-requests 4 --mem-fraction-static 0.88",
    ),
    LmdeployAdapter: (
        "lmdeploy serve api_server m --server-name 127.0.0.1 --server-port 9000"
        " --max-batch-size 8 --cache-max-entry-count 0.4 --seed 1",
        "lmdeploy serve api_server m --server-name 0.0.0.0 --server-port 9001"
        " --max-batch-size 16 --cache-max-entry-count 0.8 --tp 2",
        "lmdeploy serve api_server m --server-name 127.0.0.1 --server-port 9002"
        " --max-batch-size 4 --cache-max-entry-count 0.8",
    ),
    TrtllmAdapter: (
        "trtllm-serve m --host 127.0.0.1 --port 9000 --max_batch_size 8"
        " --kv_cache_free_gpu_memory_fraction 0.45 --seed 1",
        "trtllm-serve m --host 0.0.0.0 --port 9001 --max_batch_size 16"
        " --kv_cache_free_gpu_memory_fraction 0.9 --tp_size 2",
        "trtllm-serve m --host 127.0.0.1 --port 9002 --max_batch_size 4"
        " --kv_cache_free_gpu_memory_fraction 0.9",
    ),
}


@pytest.mark.parametrize("adapter", list(LAUNCHES), ids=lambda cls: cls.name)
def test_gpu_engines_launch_exactly_these_commands(adapter: type[GpuEngineAdapter]) -> None:
    half_shared, two_cards, no_card = LAUNCHES[adapter]
    shared = adapter(card_mem_mib=81_920, devices=[3], extra_args=["--seed", "1"])
    spec = shared.launch("m", "127.0.0.1", 9000, Slice(gpus=1, gpu_mem_mib=40_960), 8)
    assert (spec.argv, spec.env) == (half_shared.split(), {"CUDA_VISIBLE_DEVICES": "3"})
    spec = adapter().launch("m", "0.0.0.0", 9001, Slice(gpus=2), 16)
    assert (spec.argv, spec.env) == (two_cards.split(), {"CUDA_VISIBLE_DEVICES": "0,1"})
    spec = adapter().launch("m", "127.0.0.1", 9002, Slice(), 4)
    assert (spec.argv, spec.env) == (no_card.split(), {"CUDA_VISIBLE_DEVICES": ""})


def test_sim_adapter_launches_the_simulator() -> None:
    spec = get_adapter("sim").launch("sim", "127.0.0.1", 8300, Slice(), 5)
    assert spec.argv[:3] == ["gpuplane", "engine", "sim"]
    assert _flag(spec.argv, "--max-num-seqs") == "5"


def test_unknown_engine_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="did you mean 'vllm'"):
        get_adapter("vlm")


def test_unparseable_metrics_fail_loudly() -> None:
    with pytest.raises(ValueError, match="Invalid"):
        get_adapter("vllm").parse_load('vllm:num_requests_running{model_name="m" 3\n')


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]
