"""Collectors: each turns one source's answer into sample (or traffic) rows.

One module per source (`nvml`, `prometheus`, `gateway`, `store`, `files`); each is a pure parser
of that source's recorded answer plus a thin I/O edge that fetches the answer. The store
(`gpuplane.audit.sample_store.SampleStore`) is where they all write.
"""

from gpuplane.errors import GpuplaneError


class CollectError(GpuplaneError):
    """A source could not be read (unreachable, refused, or not what it should be)."""


__all__ = ["CollectError"]
