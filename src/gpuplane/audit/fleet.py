"""A seeded, seed-like GPU fleet with labelled ground truth: what the audit is measured against.

The default is the seed's estate: 260 A100-80GB cards (65 nodes of 4) serving ~20 businesses'
inference deployments (one instance per whole card, as they were before the audit) and data jobs.
Usage is drawn from the shapes published measurements report, not from one tuned trace:

- **Alibaba PAI 2020** (Weng et al., "MLaaS in the Wild", NSDI '22; the issue's figure): 98 % of
  tasks request more GPU than they use, most of them a small fraction. Here most inference
  deployments ("small") need under 10 GiB of their 80 GiB card (weights log-normal around
  3.5 GiB plus a KV cache that grows with load) and under a third of its compute.
- **Microsoft Philly** (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN
  Training Workloads", USENIX ATC '19; the issue's figure): held GPUs sit idle for 25-51 % of job
  time. Here load follows a diurnal curve cut below a per-deployment threshold, so a deployment is
  idle for 0-50 % of each day (the window ends at 14:00 UTC, when every live one has traffic).
- Cards held with no traffic: "dead" deployments keep their model loaded and serve nothing;
  "stalled" instances and data jobs stopped computing an hour or more before the window ends.
- A few heavy deployments and busy data jobs use most of their card; medium ones a quarter to a
  third of its memory.
- A few nodes are fragmented: each card keeps a remnant under a quarter card free, which none of
  the estate's request shapes can use.

Ground truth is labelled from each workload's latent profile (its true peak memory and compute,
when it stopped, whether it has traffic), never from the samples the audit reads: the samples add
per-minute bursts below the peak, so a finding computed from them can miss the truth. `truth`
applies the same thresholds (`AuditSettings`) to the latent needs.

Generation streams: `sample_batches` / `traffic_batches` yield Arrow record batches a few hundred
cards at a time, deterministic for a seed, so a 10,000-GPU week is written to Parquet without
holding it in memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from gpuplane.audit.fleet_workloads import GIB, SeedWorkload, WorkloadMaker
from gpuplane.audit.recommend import grid_mem_mib
from gpuplane.audit.samples import SAMPLE_SCHEMA, TRAFFIC_SCHEMA
from gpuplane.audit.settings import AuditSettings
from gpuplane.control.scheduler import DeviceInfo, NodeInfo
from gpuplane.resources import LABEL_GPU_MODEL


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The estate to generate; the defaults are the seed's."""

    cards: int = 260
    cards_per_node: int = 4
    card_mem_mib: int = 80 * GIB
    gpu_model: str = "A100-80GB"
    cluster: str = "seed"
    days: float = 7.0
    step_s: int = 60
    end: datetime = datetime(2026, 11, 27, 14, 0, tzinfo=UTC)
    unallocated: float = 0.02  # share of cards nobody holds
    batch: float = 0.08  # share of cards data jobs hold (besides the fragmented nodes)
    fragmented_nodes: float = 0.04  # share of nodes whose cards keep unusable remnants

    @property
    def nodes(self) -> int:
        return math.ceil(self.cards / self.cards_per_node)


@dataclass(slots=True)
class Fleet:
    """A generated estate: its nodes, workloads (with latent needs) and the fragmented nodes."""

    spec: FleetSpec
    seed: int
    nodes: tuple[NodeInfo, ...]
    workloads: tuple[SeedWorkload, ...]
    fragmented: frozenset[str]
    free_cards: tuple[tuple[str, int], ...]  # (node, card) nobody holds
    times: np.ndarray = field(repr=False)  # unix seconds of every sample

    @property
    def start_s(self) -> int:
        return int(self.times[0])

    @property
    def end_s(self) -> int:
        return int(self.times[-1]) + self.spec.step_s

    def truth(self, settings: AuditSettings | None = None) -> dict[str, frozenset[str]]:
        """The finding classes each workload truly has (and each fragmented node: `fragmented`),
        from its latent profile under `settings`' thresholds."""
        s = settings or AuditSettings()
        card = self.spec.card_mem_mib
        step = card // s.slice_fraction
        out: dict[str, frozenset[str]] = {}
        for w in self.workloads:
            classes = set()
            never = w.compute_peak == 0 or w.stop_s <= self.start_s
            if never or w.stop_s <= self.end_s - s.idle_for_s:
                classes.add("idle")
            if never and w.weights_mib >= s.held_mem_mib:
                classes.add("idle_held")
            if w.kind == "inference" and w.rps == 0:
                classes.add("zero_traffic")
            need = (w.weights_mib + w.kv_mib) * s.headroom
            if grid_mem_mib(need, card, s) <= w.alloc_mem_mib - step:
                classes.add("oversized_memory")
            if w.compute_peak < s.oversized_compute_ratio * w.alloc_cores_pct / 100:
                classes.add("oversized_compute")
            out[w.name] = frozenset(classes)
        for node in self.fragmented:
            out[node] = frozenset({"fragmented"})
        return out

    # -- samples ---------------------------------------------------------------------------

    def sample_batches(self, per_batch: int = 256) -> Iterator[pa.RecordBatch]:
        """The usage samples (the audit's sample schema), `per_batch` workloads at a time, then
        the free cards."""
        spec, t = self.spec, self.times
        names = _dictionary([*(w.name for w in self.workloads), ""])
        teams = _dictionary([*sorted({w.team for w in self.workloads}), ""])
        team_ix = {v: i for i, v in enumerate(teams.to_pylist())}
        node_names = _dictionary([n.name for n in self.nodes])
        node_ix = {v: i for i, v in enumerate(node_names.to_pylist())}
        kinds = _dictionary(["inference", "batch", ""])
        card_names = _dictionary([f"{n.name}/{d.index}" for n in self.nodes for d in n.devices])
        card_ix = {v: i for i, v in enumerate(card_names.to_pylist())}
        ts = pa.array(t, pa.timestamp("s", tz="UTC"))
        for b in range(0, len(self.workloads), per_batch):
            ws = self.workloads[b : b + per_batch]
            rng = np.random.default_rng([self.seed, 1, b])
            load = self._load(ws, rng)
            compute = np.array([w.compute_peak for w in ws], np.float32)[:, None] * load
            compute += rng.random(compute.shape, dtype=np.float32) * 0.002  # sensor noise
            weights = np.array([w.weights_mib for w in ws], np.float32)[:, None]
            mem = weights + np.array([w.kv_mib for w in ws], np.float32)[:, None] * load
            n = len(ws) * len(t)
            yield _batch(
                spec,
                ts,
                n,
                node=_codes(node_names, [node_ix[w.node] for w in ws], len(t)),
                card=_codes(card_names, [card_ix[f"{w.node}/{w.card}"] for w in ws], len(t)),
                workload=_codes(names, range(b, b + len(ws)), len(t)),
                team=_codes(teams, [team_ix[w.team] for w in ws], len(t)),
                kind=_codes(kinds, [0 if w.kind == "inference" else 1 for w in ws], len(t)),
                alloc_mem=np.repeat([w.alloc_mem_mib for w in ws], len(t)).astype(np.int32),
                alloc_cores=np.repeat([w.alloc_cores_pct for w in ws], len(t)).astype(np.int16),
                mem_used=mem.ravel(),
                compute=np.minimum(compute, 1.0).ravel(),
            )
        if self.free_cards:
            f = len(self.free_cards)
            n = f * len(t)
            yield _batch(
                spec,
                ts,
                n,
                node=_codes(node_names, [node_ix[nd] for nd, _ in self.free_cards], len(t)),
                card=_codes(
                    card_names, [card_ix[f"{nd}/{c}"] for nd, c in self.free_cards], len(t)
                ),
                workload=_codes(names, [len(self.workloads)] * f, len(t)),
                team=_codes(teams, [team_ix[""]] * f, len(t)),
                kind=_codes(kinds, [2] * f, len(t)),
                alloc_mem=np.zeros(n, np.int32),
                alloc_cores=np.zeros(n, np.int16),
                mem_used=np.zeros(n, np.float32),
                compute=np.zeros(n, np.float32),
            )

    def traffic_batches(self, per_batch: int = 256) -> Iterator[pa.RecordBatch]:
        """The gateway's traffic per instance and minute (the audit's traffic schema); the model is
        the deployment, the instance its URL (`instance_url`)."""
        inference = [w for w in self.workloads if w.kind == "inference"]
        t = self.times
        deployments = _dictionary(sorted({w.deployment for w in inference}))
        dep_ix = {v: i for i, v in enumerate(deployments.to_pylist())}
        instances = _dictionary([instance_url(w.name) for w in inference])
        ts = pa.array(t, pa.timestamp("s", tz="UTC"))
        for b in range(0, len(inference), per_batch):
            ws = inference[b : b + per_batch]
            rng = np.random.default_rng([self.seed, 2, b])
            load = self._load(ws, rng)
            rate = np.array([w.rps for w in ws])[:, None] * self.spec.step_s * load
            req = rng.poisson(rate).astype(np.int32)
            prompt = req.astype(np.int64) * rng.integers(200, 1500, size=(len(ws), 1))
            completion = req.astype(np.int64) * rng.integers(50, 400, size=(len(ws), 1))
            slot_s = req * rng.uniform(0.5, 3.0, size=(len(ws), 1))
            yield pa.RecordBatch.from_pydict(
                {
                    "time": pa.concat_arrays([ts] * len(ws)),
                    "model": _codes(deployments, [dep_ix[w.deployment] for w in ws], len(t)),
                    "instance": _codes(instances, range(b, b + len(ws)), len(t)),
                    "requests": req.ravel().astype(np.int64),
                    "prompt_tokens": prompt.ravel(),
                    "completion_tokens": completion.ravel(),
                    "slot_seconds": slot_s.ravel().astype(np.float64),
                },
                schema=TRAFFIC_SCHEMA,
            )

    def samples(self) -> pa.Table:
        return pa.Table.from_batches(list(self.sample_batches()), SAMPLE_SCHEMA)

    def traffic(self) -> pa.Table:
        return pa.Table.from_batches(list(self.traffic_batches()), TRAFFIC_SCHEMA)

    def _load(self, ws: tuple[SeedWorkload, ...] | list[SeedWorkload], rng: np.random.Generator
              ) -> np.ndarray:  # fmt: skip
        """(workloads, times) load in [0, 1]: diurnal for inference, steady for data jobs, with
        per-minute bursts; zero after a workload stops and for dead deployments."""
        t = self.times
        hours = (t % 86_400) / 3600.0
        phase = np.array([w.phase_h for w in ws])[:, None]
        theta = np.array([w.theta for w in ws])[:, None]
        diurnal = 0.5 + 0.5 * np.sin(2 * np.pi * (hours[None, :] - phase) / 24.0)
        inference = np.clip((diurnal - theta) / (1 - theta), 0.0, 1.0)
        steady = np.clip(0.85 + 0.1 * rng.standard_normal(inference.shape), 0.0, 1.0)
        is_batch = np.array([w.kind == "batch" for w in ws])[:, None]
        load = np.where(is_batch, steady, inference)
        load *= np.clip(1.0 + 0.1 * rng.standard_normal(load.shape), 0.0, None)  # bursts
        stop = np.array([w.stop_s for w in ws])[:, None]
        load = np.where(t[None, :] < stop, np.minimum(load, 1.0), 0.0)
        return load.astype(np.float32)


def generate(seed: int = 0, spec: FleetSpec | None = None) -> Fleet:
    """The fleet for `seed`: the same seed always gives the same estate, workloads and samples."""
    spec = spec or FleetSpec()
    rng = np.random.default_rng([seed, 0])
    end = int(spec.end.timestamp())
    steps = int(spec.days * 86_400 // spec.step_s)
    times = end - spec.step_s * np.arange(steps, 0, -1, dtype=np.int64)
    card_mem = spec.card_mem_mib
    nodes = tuple(
        NodeInfo(
            name=f"gpu-{i:03d}",
            cluster=spec.cluster,
            cpu_millis=64_000,
            memory_mib=512 * GIB,
            devices=tuple(
                DeviceInfo(d, card_mem)
                for d in range(min(spec.cards_per_node, spec.cards - i * spec.cards_per_node))
            ),
            labels={LABEL_GPU_MODEL: spec.gpu_model},
        )
        for i in range(spec.nodes)
    )
    n_frag = max(1, round(spec.fragmented_nodes * len(nodes)))
    frag_rows = set(rng.choice(len(nodes), size=n_frag, replace=False).tolist())
    cards = [
        (n.name, d.index) for i, n in enumerate(nodes) if i not in frag_rows for d in n.devices
    ]
    order = rng.permutation(len(cards))
    n_free = round(spec.unallocated * spec.cards)
    n_batch = round(spec.batch * spec.cards)
    free = [cards[i] for i in order[:n_free]]
    batch_cards = [cards[i] for i in order[n_free : n_free + n_batch]]
    inference_cards = [cards[i] for i in order[n_free + n_batch :]]
    start = int(times[0])
    g = WorkloadMaker(rng, card_mem, start, end)
    workloads: list[SeedWorkload] = []
    workloads += g.deployments(inference_cards)
    workloads += g.data_jobs(batch_cards)
    for i in sorted(frag_rows):
        workloads += g.remnant_jobs(nodes[i])
    return Fleet(
        spec,
        seed,
        nodes,
        tuple(workloads),
        frozenset(nodes[i].name for i in frag_rows),
        tuple(sorted(free)),
        times,
    )


def instance_url(workload: str) -> str:
    """The URL the gateway knows an inference workload's instance by (its pod's DNS name)."""
    return f"http://{workload}:8000"


def _dictionary(values: list[str]) -> pa.Array:
    return pa.array(values, pa.string())


def _codes(dictionary: pa.Array, codes: object, repeat: int) -> pa.DictionaryArray:
    idx = np.repeat(np.fromiter(codes, dtype=np.int32), repeat)  # type: ignore[call-overload]
    return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), dictionary)


def _batch(
    spec: FleetSpec,
    times: pa.Array,
    n: int,
    *,
    node: pa.Array,
    card: pa.Array,
    workload: pa.Array,
    team: pa.Array,
    kind: pa.Array,
    alloc_mem: np.ndarray,
    alloc_cores: np.ndarray,
    mem_used: np.ndarray,
    compute: np.ndarray,
) -> pa.RecordBatch:
    reps = n // len(times)
    zeros = pa.array(np.zeros(n, np.int32))
    const = pa.DictionaryArray.from_arrays(zeros, pa.array([spec.cluster]))
    model = pa.DictionaryArray.from_arrays(zeros, pa.array([spec.gpu_model]))
    return pa.RecordBatch.from_pydict(
        {
            "time": pa.concat_arrays([times] * reps),
            "cluster": const,
            "node": node,
            "card": card,
            "gpu_model": model,
            "workload": workload,
            "team": team,
            "kind": kind,
            "card_mem_mib": pa.array(np.full(n, spec.card_mem_mib, np.int32)),
            "alloc_mem_mib": pa.array(alloc_mem),
            "alloc_cores_pct": pa.array(alloc_cores),
            "mem_used_mib": pa.array(mem_used.astype(np.float32)),
            "compute_share": pa.array(compute.astype(np.float32)),
        },
        schema=SAMPLE_SCHEMA,
    )
