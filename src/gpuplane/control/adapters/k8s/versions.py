"""Which Kubernetes versions the adapter speaks, and what it uses on each: read from the server's
`/version` and its discovery documents at registration, so a cluster on an unsupported version
is refused before anything is bound there.

The fields that differ across the supported range are Job features: `podFailurePolicy` (beta and
on by default from 1.26: an eviction does not count as the Job's failure) and
`podReplacementPolicy: Failed` (beta from 1.29: a replacement Pod starts only once the evicted
one has terminated, so it never waits for its own card). Every manifest the adapter can emit is
validated against each supported version's OpenAPI schema in the tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.control.adapters.base import AdapterError

# the oldest and newest minor versions of Kubernetes 1.x the adapter is tested against
SUPPORTED = (25, 35)
POD_FAILURE_POLICY_FROM = 26
POD_REPLACEMENT_POLICY_FROM = 29


def supported_range() -> str:
    return f"1.{SUPPORTED[0]} to 1.{SUPPORTED[1]}"


@dataclass(frozen=True, slots=True)
class ApiProfile:
    """What one server serves that the adapter relies on."""

    minor: int
    git_version: str
    groups: frozenset[str]  # served group/versions ("v1", "batch/v1", ...)

    @property
    def pod_failure_policy(self) -> bool:
        return self.minor >= POD_FAILURE_POLICY_FROM

    @property
    def pod_replacement_policy(self) -> bool:
        return self.minor >= POD_REPLACEMENT_POLICY_FROM


def parse_minor(version: Mapping[str, Any]) -> int | None:
    """The minor version of a `/version` answer (`"29"`, or a vendor's `"29+"`, else from
    `gitVersion` such as `v1.29.3-eks-1234`); None when it is not Kubernetes 1.x."""
    if str(version.get("major", "")).rstrip("+") == "1":
        m = re.match(r"\d+", str(version.get("minor", "")))
        if m:
            return int(m.group())
    m = re.match(r"v?1\.(\d+)", str(version.get("gitVersion", "")))
    return int(m.group(1)) if m else None


def served_groups(core: Mapping[str, Any], groups: Mapping[str, Any]) -> frozenset[str]:
    """Group/versions from `/api` (APIVersions) and `/apis` (APIGroupList)."""
    served = set(core.get("versions", []))
    for group in groups.get("groups", []):
        served.update(v["groupVersion"] for v in group.get("versions", []))
    return frozenset(served)


def api_profile(
    version: Mapping[str, Any],
    core: Mapping[str, Any],
    groups: Mapping[str, Any],
    needs: Iterable[str],
    where: str,
) -> ApiProfile:
    """The profile of a server, or AdapterError naming its version, what is missing and the
    supported range. `needs`: the group/versions this cluster's settings use."""
    minor = parse_minor(version)
    shown = str(version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}")
    if minor is None or not SUPPORTED[0] <= minor <= SUPPORTED[1]:
        raise AdapterError(
            f"{where} runs Kubernetes {shown}, which this adapter does not support: it supports "
            f"{supported_range()}; upgrade the cluster or register a supported one"
        )
    served = served_groups(core, groups)
    missing = sorted(set(needs) - served)
    if missing:
        raise AdapterError(
            f"{where} (Kubernetes {shown}) does not serve {', '.join(missing)}, which the "
            f"adapter needs; enable it there or set bind_kind: pod"
        )
    return ApiProfile(minor, shown, served)
