"""Kubernetes clusters at scale through the kubernetes adapter, beside the local adapter.

Estate: `--clusters` fake API servers (tests/control/k8s_fake; no real API server can run here),
each its own process, on minor versions 1.26, 1.28, 1.30, 1.32, with `--nodes` nodes in all
(default 1,250) of `--gpus` HAMi cards each (default 8: 10,000 GPUs), registered in HAMi's JSON
annotation, models and regions mixed per seed. The local adapter gets the same nodes declared
in its config. Measured per seed, then the median and spread (min..max) over seeds:

- full sync: from nothing (new adapters; the client library already imported) to every
  cluster's inventory written into a fresh SQLite store with `sync_cluster`, clusters one after
  another as `ControlService.start` does; also the adapters' part alone (connect, discovery,
  paged list);
- watch event -> store: `--events` node changes per cluster (a card turns unhealthy, as HAMi's
  device plugin re-registers it) paced at `--rate` per second per cluster, from the write in the
  API server's process to (a) the adapter's inventory showing it and (b) that node's rows
  committed to the store by a syncer woken by `on_change` (changes coalesce): the syncer writes
  what `adapter.changes()` answers with `sync_nodes`; side by side, a round in which it writes
  the whole cluster with `sync_cluster` on each wake (as before `sync_nodes`); p50 / p99 over
  all events;
- binds/s: `--binds` Pods bound one after another through one adapter (create, 201 read), then
  released; the local adapter binds the same number of workloads (each a `sleep` process).

    .venv/bin/python benchmarks/cluster_sync.py                     # 1,250 nodes x 8, seeds 0-2
    .venv/bin/python benchmarks/cluster_sync.py --nodes 200 --events 50 --binds 100 --seeds 0
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _extras import optional_imports  # noqa: E402

with optional_imports():
    import numpy as np

    from _results import save

RESULTS = Path(__file__).with_name("results") / "cluster_sync.json"
MINORS = (26, 28, 30, 32)
MODELS = (
    ("NVIDIA-A100-SXM4-80GB", 81920),
    ("NVIDIA-H100-80GB-HBM3", 81920),
    ("NVIDIA-L40S", 46068),
)
REGIONS = ("eu-west-4", "us-east-1", "ap-south-1")
SEQ = "bench.gpuplane.io/seq"


def node_specs(cluster: int, count: int, gpus: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng([seed, cluster])
    model, mem = MODELS[int(rng.integers(len(MODELS)))]
    region = REGIONS[cluster % len(REGIONS)]
    return [
        {
            "name": f"c{cluster}-node-{i:04d}",
            "labels": {"topology.kubernetes.io/region": region, "pool": f"p{int(rng.integers(4))}"},
            "cards": [
                {"uuid": f"GPU-{cluster:02x}{i:06x}{k:02x}", "index": k, "model": model, "mem": mem}
                for k in range(gpus)
            ],
        }
        for i in range(count)
    ]


def serve_fake(conn: Connection, minor: int, specs: list[dict[str, Any]]) -> None:
    """One fake cluster in its own process; answers commands on `conn`."""
    from tests.control.k8s_fake import FakeKubeApi, hami_card

    api = FakeKubeApi(minor=minor, bookmark_interval_s=1.0).start()
    for spec in specs:
        cards = [
            hami_card(c["uuid"], index=c["index"], model=c["model"], mem_mib=c["mem"])
            for c in spec["cards"]
        ]
        api.add_node(spec["name"], labels=spec["labels"], cards=cards)
    conn.send(api.url)
    while (msg := conn.recv())[0] != "stop":
        _, events, rate, seed = msg
        rng = np.random.default_rng(seed)
        base = seed[1] * events  # seqs keep rising across rounds
        sent = []
        start = time.monotonic()
        for seq in range(base + 1, base + events + 1):
            time.sleep(max(0.0, start + (seq - base) / rate - time.monotonic()))
            spec = specs[int(rng.integers(len(specs)))]
            cards = [
                hami_card(
                    c["uuid"],
                    index=c["index"],
                    model=c["model"],
                    mem_mib=c["mem"],
                    health=c["index"] != seq % len(spec["cards"]),
                )
                for c in spec["cards"]
            ]

            def change(
                obj: dict[str, Any], cards: list[dict[str, Any]] = cards, seq: int = seq
            ) -> None:
                from tests.control.k8s_fake import encode_register

                obj["metadata"]["annotations"]["hami.io/node-nvidia-register"] = encode_register(
                    cards
                )
                obj["metadata"]["labels"][SEQ] = str(seq)

            t0 = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process here
            api.state.update("nodes", "", spec["name"], change)
            sent.append((seq, t0, spec["name"]))
        conn.send(sent)
    api.stop()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_seed(args: argparse.Namespace, seed: int, tmp: Path) -> dict[str, Any]:
    from tests.control.k8s_fake import write_kubeconfig

    from gpuplane.control.adapters import Inventory, Workload, create_adapter
    from gpuplane.control.scheduler import DeviceGrant
    from gpuplane.control.service.inventory import sync_cluster, sync_nodes
    from gpuplane.control.settings import ClusterConfig, ControlConfig, DeclaredGpus, DeclaredNode
    from gpuplane.control.store.store import Store

    per = [
        args.nodes // args.clusters + (i < args.nodes % args.clusters) for i in range(args.clusters)
    ]
    specs = [node_specs(i, n, args.gpus, seed) for i, n in enumerate(per)]
    ctx = mp.get_context("spawn")
    pipes, procs, urls = [], [], []
    for i, cluster_specs in enumerate(specs):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=serve_fake, args=(theirs, MINORS[i % len(MINORS)], cluster_specs), daemon=True
        )
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    urls = [p.recv() for p in pipes]
    out: dict[str, Any] = {"seed": seed}
    try:
        control = ControlConfig(state_dir=str(tmp / f"s{seed}"), service_id="bench:1")
        clusters = []
        for i, url in enumerate(urls):
            kc = write_kubeconfig(url, tmp / f"kc-{seed}-{i}")
            clusters.append(
                ClusterConfig(
                    name=f"kube-{i}", adapter="kubernetes", kubeconfig=kc, sync_interval_s=30
                )
            )

        def full_sync(configs: list[Any], db: str) -> tuple[float, float, list[Any], Store]:
            store = Store.open(f"sqlite:///{db}")
            t0 = time.perf_counter()
            adapters, inventories = [], []
            for cfg in configs:
                adapter = create_adapter(cfg, control)
                adapter.changes()  # None: this sync writes everything; later ones what changed
                inventories.append(adapter.inventory())
                adapters.append(adapter)
            listed = time.perf_counter() - t0
            for cfg, inv in zip(configs, inventories, strict=True):
                with store.session() as session, session.begin():
                    sync_cluster(session, cfg.name, cfg.adapter, {}, cfg.region, inv, time.time())
            return time.perf_counter() - t0, listed, adapters, store

        total, listed, adapters, store = full_sync(clusters, str(tmp / f"k8s-{seed}.db"))
        nodes = sum(len(a.inventory().nodes) for a in adapters)
        gpus = sum(len(n.devices) for a in adapters for n in a.inventory().nodes)
        assert (nodes, gpus) == (args.nodes, args.nodes * args.gpus), (nodes, gpus)
        local_cfgs = [
            ClusterConfig(
                name=f"local-{i}",
                discover_gpus=False,
                nodes=[
                    DeclaredNode(
                        name=s["name"],
                        labels=s["labels"],
                        gpus=[
                            DeclaredGpus(
                                model=s["cards"][0]["model"],
                                mem_mib=s["cards"][0]["mem"],
                                count=args.gpus,
                            )
                        ],
                    )
                    for s in cluster_specs
                ],
            )
            for i, cluster_specs in enumerate(specs)
        ]
        local_total, local_listed, _, _ = full_sync(local_cfgs, str(tmp / f"local-{seed}.db"))
        out["sync"] = {
            "kubernetes_s": total,
            "kubernetes_list_s": listed,
            "local_s": local_total,
            "local_list_s": local_listed,
        }

        # -- watch event -> adapter view -> store -----------------------------------------------
        seen: dict[tuple[int, int], float] = {}
        # per cluster: (commit time, {node: the seq label of the copy written}) per transaction
        writes: list[list[tuple[float, dict[str, int]]]] = [[] for _ in adapters]
        stop = threading.Event()

        def highest_seq(adapter: Any) -> int:
            return max(
                (int(v.node.labels.get(SEQ, 0)) for v in adapter._nodes.snapshot()), default=0
            )

        def sync_once(i: int, adapter: Any, whole: bool) -> None:
            """One syncer pass: what changed (`sync_nodes`), or everything (`sync_cluster`)."""
            change = None if whole else adapter.changes()
            with store.session() as session, session.begin():
                if change is None:
                    nodes = adapter.inventory().nodes
                    inv = Inventory(nodes, "bench")
                    sync_cluster(
                        session, clusters[i].name, "kubernetes", {}, "local", inv, time.time()
                    )
                else:
                    nodes = change.nodes
                    sync_nodes(session, clusters[i].name, change)
            t = time.monotonic()
            writes[i].append((t, {n.name: int(n.labels.get(SEQ, 0)) for n in nodes}))

        def syncer(i: int, adapter: Any, wake: threading.Event, whole: bool) -> None:
            while not stop.is_set():
                if wake.wait(0.2):
                    wake.clear()
                    sync_once(i, adapter, whole)

        def on_change(i: int, adapter: Any, wake: threading.Event) -> Callable[[], None]:
            def changed() -> None:  # on the watch's thread: note when the view shows it
                top = highest_seq(adapter)
                t = time.monotonic()
                for seq in range(1, top + 1):
                    seen.setdefault((i, seq), t)
                wake.set()

            return changed

        def stored_at(i: int, node: str, seq: int) -> float | None:
            """When a copy of `node` at least as new as event `seq` was first committed."""
            return next((t for t, got in writes[i] if got.get(node, 0) >= seq), None)

        def events_round(
            round_: int, store_mode: str | None
        ) -> tuple[list[float], list[float], int]:
            seen.clear()
            stop.clear()
            threads = []
            for i, adapter in enumerate(adapters):
                if store_mode is not None:
                    sync_once(i, adapter, whole=False)  # the earlier rounds' changes: not timed
                    writes[i].clear()
                    th = threading.Thread(
                        target=syncer,
                        args=(i, adapter, wakes[i], store_mode == "whole"),
                        daemon=True,
                    )
                    th.start()
                    threads.append(th)
            for i, pipe in enumerate(pipes):
                pipe.send(("events", args.events, args.rate, [seed, round_, i]))
            sent = {
                (i, seq): (t0, node)
                for i, pipe in enumerate(pipes)
                for seq, t0, node in pipe.recv()
            }
            deadline = time.monotonic() + 60
            stored: dict[tuple[int, int], float] = {}

            def pending() -> bool:  # stops at the first event not there yet: cheap to poll
                if store_mode is None:
                    return not sent.keys() <= seen.keys()
                for (i, seq), (_, node) in sent.items():
                    if (i, seq) not in stored:
                        if (t := stored_at(i, node, seq)) is None:
                            return True
                        stored[(i, seq)] = t
                return False

            while pending() and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            for th in threads:
                th.join()
            to_view = [(seen[k] - t0) * 1000 for k, (t0, _) in sent.items() if k in seen]
            to_store = [(stored[k] - t0) * 1000 for k, (t0, _) in sent.items() if k in stored]
            return to_view, to_store, len(sent)

        wakes = [threading.Event() for _ in adapters]
        for i, adapter in enumerate(adapters):
            adapter.on_change(on_change(i, adapter, wakes[i]))
        to_view, _, sent_view = events_round(0, None)
        _, to_store, sent_store = events_round(1, "changes")
        _, to_store_whole, sent_whole = events_round(2, "whole")
        out["events"] = {
            "sent": sent_view + sent_store + sent_whole,
            "seen": len(to_view),
            "stored": len(to_store),
            "stored_whole": len(to_store_whole),
            "view_p50_ms": percentile(to_view, 50),
            "view_p99_ms": percentile(to_view, 99),
            "store_p50_ms": percentile(to_store, 50),
            "store_p99_ms": percentile(to_store, 99),
            "store_whole_p50_ms": percentile(to_store_whole, 50),
            "store_whole_p99_ms": percentile(to_store_whole, 99),
        }

        # -- binds -----------------------------------------------------------------------------
        k8s = adapters[0]
        cards = [(n.name, d.index) for n in k8s.inventory().nodes for d in n.devices]
        workloads = [
            Workload(
                job_id=f"b{seed}-{j}",
                name="bench",
                command=("sleep", "600"),
                node=cards[j % len(cards)][0],
                devices=(DeviceGrant(cards[j % len(cards)][1], 8192, 100),),
                fractional=True,
                team="bench",
            )
            for j in range(args.binds)
        ]
        k8s.bind(workloads[0])  # the team's namespace is made on the first bind: not timed
        k8s.release(workloads[0].job_id)
        t0 = time.perf_counter()
        for w in workloads[1:]:
            k8s.bind(w)
        k8s_bind_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for w in workloads[1:]:
            k8s.release(w.job_id)
        k8s_release_s = time.perf_counter() - t0
        local = create_adapter(ClusterConfig(name="local-bind", discover_gpus=False), control)
        t0 = time.perf_counter()
        for w in workloads[1:]:
            local.bind(w)
        local_bind_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        local.close()
        local_release_s = time.perf_counter() - t0
        n = len(workloads) - 1
        out["binds"] = {
            "count": n,
            "kubernetes_per_s": n / k8s_bind_s,
            "kubernetes_releases_per_s": n / k8s_release_s,
            "local_per_s": n / local_bind_s,
            "local_releases_per_s": n / local_release_s,
        }
        for adapter in adapters:
            adapter.close()
        store.close()
    finally:
        for pipe in pipes:
            pipe.send(("stop",))
        for proc in procs:
            proc.join(timeout=10)
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=1250, help="in all clusters together")
    parser.add_argument("--gpus", type=int, default=8, help="HAMi cards per node")
    parser.add_argument("--events", type=int, default=200, help="node changes per cluster")
    parser.add_argument(
        "--rate", type=float, default=20.0, help="node changes per second per cluster"
    )
    parser.add_argument("--binds", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", action="store_true", help="also print the results as one line")
    args = parser.parse_args()
    t0 = time.perf_counter()
    from kubernetes.client import BatchV1Api, CoreV1Api  # noqa: F401  imported once per process

    client_import_s = time.perf_counter() - t0  # reported apart: not the sync's

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            run = run_seed(args, seed, Path(tmp))
            runs.append(run)
            s, e, b = run["sync"], run["events"], run["binds"]
            print(
                f"seed {seed}: full sync {s['kubernetes_s']:.2f}s "
                f"(lists {s['kubernetes_list_s']:.2f}s; local {s['local_s']:.2f}s) | "
                f"event->view p50 {e['view_p50_ms']:.1f} p99 "
                f"{e['view_p99_ms']:.1f} ms, ->store p50 {e['store_p50_ms']:.1f} p99 "
                f"{e['store_p99_ms']:.1f} ms (whole-cluster writes: p99 "
                f"{e['store_whole_p99_ms']:.0f} ms) | binds/s "
                f"{b['kubernetes_per_s']:.0f} (local {b['local_per_s']:.0f})",
                flush=True,
            )
    keys = {
        "full_sync_s": ("sync", "kubernetes_s"),
        "adapters_list_s": ("sync", "kubernetes_list_s"),
        "local_full_sync_s": ("sync", "local_s"),
        "event_to_view_p50_ms": ("events", "view_p50_ms"),
        "event_to_view_p99_ms": ("events", "view_p99_ms"),
        "event_to_store_p50_ms": ("events", "store_p50_ms"),
        "event_to_store_p99_ms": ("events", "store_p99_ms"),
        "event_to_store_whole_p50_ms": ("events", "store_whole_p50_ms"),
        "event_to_store_whole_p99_ms": ("events", "store_whole_p99_ms"),
        "binds_per_s": ("binds", "kubernetes_per_s"),
        "releases_per_s": ("binds", "kubernetes_releases_per_s"),
        "local_binds_per_s": ("binds", "local_per_s"),
        "local_releases_per_s": ("binds", "local_releases_per_s"),
    }
    summary = {k: spread([r[a][b] for r in runs]) for k, (a, b) in keys.items()}
    # per seed, side by side: whole-cluster writes over changed-nodes writes, event -> store p99
    summary["store_p99_whole_over_changes"] = spread(
        [r["events"]["store_whole_p99_ms"] / r["events"]["store_p99_ms"] for r in runs]
    )
    out = {
        "benchmark": "cluster_sync",
        "params": {k: v for k, v in vars(args).items() if k != "json"},
        "client_import_s": client_import_s,
        "goals": {"full_sync_s": 5.0, "event_to_store_p99_ms": 100.0, "binds_per_s": 500.0},
        "summary": summary,
        "runs": runs,
    }
    for k, v in summary.items():
        print(f"{k:24s} median {v['median']:.2f} ({v['min']:.2f}..{v['max']:.2f})")
    save(out, RESULTS, echo_json=args.json)


if __name__ == "__main__":
    main()
