"""Usage from Prometheus: dcgm-exporter per card, HAMi per container on shared cards.

The edge (`PromClient.query_range`) asks the HTTP query API (`/api/v1/query_range`, httpx) for
each metric's raw series over a window. The pure part (`samples`) joins them per card and time:

- dcgm-exporter, per card (`UUID`, `Hostname`, `modelName`; `namespace`/`pod` when it maps a
  card to one pod): `DCGM_FI_DEV_FB_USED` + `DCGM_FI_DEV_FB_FREE` (+ `_RESERVED`) MiB make the
  card's memory; its compute is `DCGM_FI_PROF_SM_ACTIVE` when profiling metrics are enabled,
  else `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, else `DCGM_FI_DEV_GPU_UTIL` / 100.
- HAMi's vGPU monitor, per container and card (`device_uuid`): `hami_vgpu_memory_used_bytes`,
  `hami_vgpu_memory_limit_bytes` and `hami_container_device_utilization_ratio` (0-100 of the
  whole card, HAMi-core's per-process NVML samples summed per container), or their legacy names
  (`vGPU_device_memory_usage_in_bytes`, `vGPU_device_memory_limit_in_bytes`,
  `Device_utilization_desc_of_container`, labels `podnamespace`/`podname`/`deviceuuid`); HAMi's
  scheduler gives each pod's cores (`hami_vgpu_core_allocated_ratio`, legacy
  `vGPUCoreAllocated`).

A card HAMi shares gets one sample per pod from HAMi's own per-container figures. DCGM cannot
attribute a shared card (with time-slicing it copies the one device value onto every pod,
dcgm-exporter issue 642), so its device value is never given to a pod: a card DCGM maps to
several pods without HAMi data gets one sample per pod with usage unknown (null). A card DCGM
maps to one pod is that pod's, whole; a card with no pod is free, its device usage kept. The
workload is `<namespace>/<pod>`; its team, the namespace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pyarrow as pa

from gpuplane.audit.collect import CollectError
from gpuplane.audit.samples import Sample, to_table

MIB = 1 << 20
MAX_POINTS = 10_000  # per series and query; Prometheus refuses more than 11,000

# name -> (names to query, newest first); the legacy names carry other labels (_LEGACY_LABELS)
METRICS: dict[str, tuple[str, ...]] = {
    "fb_used": ("DCGM_FI_DEV_FB_USED",),
    "fb_free": ("DCGM_FI_DEV_FB_FREE",),
    "fb_reserved": ("DCGM_FI_DEV_FB_RESERVED",),
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE",),
    "gr_active": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE",),
    "gpu_util": ("DCGM_FI_DEV_GPU_UTIL",),
    "ctr_mem_used": ("hami_vgpu_memory_used_bytes", "vGPU_device_memory_usage_in_bytes"),
    "ctr_mem_limit": ("hami_vgpu_memory_limit_bytes", "vGPU_device_memory_limit_in_bytes"),
    "ctr_util": ("hami_container_device_utilization_ratio", "Device_utilization_desc_of_container"),
    "pod_cores": ("hami_vgpu_core_allocated_ratio", "vGPUCoreAllocated"),
}
# HAMi's legacy label names -> the current ones
_LEGACY_LABELS = {
    "podnamespace": "namespace",
    "podname": "pod",
    "ctrname": "container",
    "deviceuuid": "device_uuid",
    "nodename": "node",
}


@dataclass(frozen=True, slots=True)
class PromSeries:
    """One series of a range query: its labels and (unix time, value) points."""

    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]


# metric key (of METRICS) -> its series
Fetched = Mapping[str, Sequence[PromSeries]]


@dataclass(slots=True)
class _Card:
    node: str = ""
    model: str = ""
    used: float | None = None
    free: float | None = None
    reserved: float = 0.0
    compute: dict[str, float] | None = None
    dcgm_pods: set[str] | None = None


@dataclass(slots=True)
class _Slice:
    mem_used: float | None = None
    mem_limit: float | None = None
    util: float | None = None


def _pod(labels: Mapping[str, str]) -> str | None:
    ns, pod = labels.get("namespace") or labels.get("exported_namespace"), labels.get("pod")
    pod = pod or labels.get("exported_pod")
    return f"{ns}/{pod}" if ns and pod else None


def _dcgm_cards(fetched: Fetched) -> dict[tuple[float, str], _Card]:
    """DCGM's series by (time, card UUID): memory used, free and reserved, compute, pods."""
    cards: dict[tuple[float, str], _Card] = {}
    for key in ("fb_used", "fb_free", "fb_reserved", "sm_active", "gr_active", "gpu_util"):
        for s in fetched.get(key, ()):
            uuid = s.labels.get("UUID") or s.labels.get("uuid")
            if not uuid:
                continue
            pod = _pod(s.labels)
            for t, v in s.points:
                card = cards.setdefault((t, uuid), _Card())
                card.node = card.node or s.labels.get("Hostname", "")
                card.model = card.model or s.labels.get("modelName", "")
                if pod is not None:
                    card.dcgm_pods = (card.dcgm_pods or set()) | {pod}
                if key == "fb_used":
                    card.used = v
                elif key == "fb_free":
                    card.free = v
                elif key == "fb_reserved":
                    card.reserved = v
                else:
                    card.compute = (card.compute or {}) | {key: v}
    return cards


def _hami_slices(
    fetched: Fetched,
) -> tuple[dict[tuple[float, str, str], _Slice], dict[str, str]]:
    """HAMi's per-pod series by (time, card UUID, pod), and the node of each card it names."""
    slices: dict[tuple[float, str, str], _Slice] = {}
    hami_nodes: dict[str, str] = {}
    for key in ("ctr_mem_used", "ctr_mem_limit", "ctr_util"):
        for s in fetched.get(key, ()):
            labels = {_LEGACY_LABELS.get(k, k): v for k, v in s.labels.items()}
            uuid, pod = labels.get("device_uuid"), _pod(labels)
            if not uuid or pod is None:
                continue
            if labels.get("node"):
                hami_nodes[uuid] = labels["node"]
            for t, v in s.points:
                sl = slices.setdefault((t, uuid, pod), _Slice())
                # a pod's containers on one card add up
                if key == "ctr_mem_used":
                    sl.mem_used = (sl.mem_used or 0.0) + v / MIB
                elif key == "ctr_mem_limit":
                    sl.mem_limit = (sl.mem_limit or 0.0) + v / MIB
                else:
                    sl.util = (sl.util or 0.0) + v / 100
    return slices, hami_nodes


def samples(fetched: Fetched, cluster: str) -> pa.Table:
    """The sample rows of one window's series (all cards, all times)."""
    cards = _dcgm_cards(fetched)
    slices, hami_nodes = _hami_slices(fetched)
    cores: dict[tuple[float, str, str], float] = {}
    for s in fetched.get("pod_cores", ()):
        labels = {_LEGACY_LABELS.get(k, k): v for k, v in s.labels.items()}
        uuid, pod = labels.get("device_uuid"), _pod(labels)
        if uuid and pod is not None:
            for t, v in s.points:
                cores[(t, uuid, pod)] = v
    shared: dict[tuple[float, str], list[tuple[str, _Slice]]] = {}
    for (t, uuid, pod), sl in slices.items():
        shared.setdefault((t, uuid), []).append((pod, sl))
    rows: list[Sample] = []
    for (t, uuid), card in sorted(cards.items()):
        if card.used is None or card.free is None:
            continue  # the card's size is unknown at this time
        card_mem = round(card.used + card.free + card.reserved)
        base: dict[str, Any] = {
            "time": datetime.fromtimestamp(t, UTC),
            "cluster": cluster,
            "node": card.node or hami_nodes.get(uuid, ""),
            "card": uuid,
            "gpu_model": card.model,
            "card_mem_mib": card_mem,
        }
        if (t, uuid) in shared:
            for pod, sl in sorted(shared[(t, uuid)]):
                pct = cores.get((t, uuid, pod))
                rows.append(
                    Sample(
                        **base,
                        workload=pod,
                        team=pod.split("/", 1)[0],
                        alloc_mem_mib=None
                        if sl.mem_limit is None
                        else min(round(sl.mem_limit), card_mem),
                        alloc_cores_pct=None if pct is None else round(pct),
                        mem_used_mib=None if sl.mem_used is None else min(sl.mem_used, card_mem),
                        compute_share=None if sl.util is None else min(sl.util, 1.0),
                    )
                )
            continue
        pods = sorted(card.dcgm_pods or ())
        if len(pods) > 1:  # time-sliced: DCGM's per-pod values are copies of the device's
            rows.extend(Sample(**base, workload=p, team=p.split("/", 1)[0]) for p in pods)
            continue
        used, share = min(card.used, card_mem), _compute(card.compute or {})
        if pods:
            rows.append(
                Sample(
                    **base,
                    workload=pods[0],
                    team=pods[0].split("/", 1)[0],
                    alloc_mem_mib=card_mem,
                    alloc_cores_pct=100,
                    mem_used_mib=used,
                    compute_share=share,
                )
            )
        else:
            rows.append(Sample(**base, mem_used_mib=used, compute_share=share))
    return to_table(rows)


def _compute(values: Mapping[str, float]) -> float | None:
    for key, scale in (("sm_active", 1.0), ("gr_active", 1.0), ("gpu_util", 0.01)):
        if key in values and not math.isnan(values[key]):
            return min(1.0, max(0.0, values[key] * scale))
    return None


class PromClient:
    """The I/O edge: Prometheus's HTTP query API."""

    def __init__(
        self, url: str, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[PromSeries]:
        """The series of `expr` at `start`, `start + step`, ... up to `end` (unix seconds)."""
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:g}",
        }
        try:
            response = self._http.get("/api/v1/query_range", params=params)
        except httpx.HTTPError as exc:
            raise CollectError(
                f"cannot reach Prometheus at {self.url}: {exc}; check --url"
            ) from None
        body = _json(response)
        if response.status_code != 200 or body.get("status") != "success":
            kind = body.get("errorType", response.status_code)
            why = body.get("error", response.text[:200])
            raise CollectError(f"Prometheus at {self.url} refused {expr!r}: {kind}: {why}")
        out = []
        for r in body["data"]["result"]:
            points = [(float(t), float(v)) for t, v in r.get("values", [])]
            out.append(PromSeries(dict(r.get("metric", {})), points))
        return out

    def fetch(self, start: float, end: float, step_s: float) -> dict[str, list[PromSeries]]:
        """Every metric of `METRICS` over the window; for a metric under several names, the
        first name that has series."""
        out: dict[str, list[PromSeries]] = {}
        for key, names in METRICS.items():
            for name in names:
                found = self.query_range(name, start, end, step_s)
                if found:
                    out[key] = found
                    break
        return out

    def close(self) -> None:
        self._http.close()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def collect(
    client: PromClient, cluster: str, since: datetime, until: datetime, step_s: float = 60.0
) -> pa.Table:
    """The samples of `[since, until)`, at multiples of `step_s`."""
    start = math.ceil(since.timestamp() / step_s) * step_s
    end = until.timestamp() - 1e-3
    tables = []
    while start <= end:  # Prometheus answers at most 11,000 points per series
        stop = min(end, start + (MAX_POINTS - 1) * step_s)
        tables.append(samples(client.fetch(start, stop, step_s), cluster))
        start = stop + step_s
    return pa.concat_tables(tables) if tables else to_table([])
