"""The `batch:` section of gpuplane.yaml: what `gpuplane batch` commands take when a flag is unset.

Every field has the default its flag had, so with no file the commands behave as they always
did; a flag given on the command line overrides the file (`--storage-option` key by key).
`config.py` reads this section with every file, so nothing here imports the batch tier's own
dependencies (fsspec, the runners) unless a value needs checking.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from gpuplane.errors import unknown_name
from gpuplane.sections import Section, passes

VERIFY_CLIPS = (
    "key clips by a sha256 of their bytes, not the store's checksum or size and mtime "
    "(reads every clip, even when the cache has all its stages)"
)


class BatchConfig(Section):
    """The defaults of `gpuplane batch run`, `plan` and `cache`: storage, devices, runner, I/O."""

    cache_url: str = Field(
        default=".gpuplane/cache", description="stage cache URL (fsspec); empty: no cache"
    )
    runs_dir: str = Field(
        default=".gpuplane/runs",
        description="where a run directory goes when --out is not given (named after the "
        "pipeline and the clips, so the same command resumes the same run)",
    )
    pattern: str = Field(default="*", description="glob on clip file names")
    gpus: int | None = Field(
        default=None,
        ge=1,
        description="declare N cards; unset: the GPUs nvidia-smi lists, else 2 declared",
    )
    gpu_mem_mib: int = Field(default=81920, ge=1, description="memory of each declared card")
    runner: str = Field(default="local", description="local or ray")
    ray_address: str | None = Field(default=None, description="Ray cluster to join (ray runner)")
    ray_token_file: str | None = Field(
        default=None,
        description="file holding the Ray cluster's auth token (Ray's token authentication); "
        "unset: Ray's own RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH",
    )
    threads: bool = Field(default=False, description="local runner: threads, not processes")
    cpu_slots: int | None = Field(
        default=None, ge=1, description="local runner: tasks at once; unset: the host's cores"
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options of the clips' filesystem"
    )
    prefetch_items: int = Field(
        default=8, ge=1, description="clips held at once (downloading or computing)"
    )
    prefetch_bytes: str = Field(default="1G", description="bytes of clips held at once (500M, 2G)")
    io_workers: int = Field(default=4, ge=1, description="parallel downloads")
    calibrate: bool = Field(
        default=False,
        description="time one clip before planning when no earlier run measured the stages",
    )
    verify_clips: bool = Field(default=False, description=VERIFY_CLIPS)
    report: bool = Field(default=True, description="write report.html in the run directory")
    progress: bool = Field(default=True, description="show progress (off when not a terminal)")

    @field_validator("runner")
    @classmethod
    def _known_runner(cls, name: str) -> str:
        # the runners need the `batch` extra: only a file that names one imports them here
        from gpuplane.batch.runners.base import runner_names

        if name not in runner_names():
            raise ValueError(unknown_name("runner", name, runner_names()))
        return name

    @field_validator("prefetch_bytes")
    @classmethod
    def _size(cls, text: str) -> str:
        from gpuplane.batch.cache import parse_size

        return passes(parse_size, text)
