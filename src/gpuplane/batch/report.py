"""The run report (HTML with embedded SVG plots) and the comparison of two runs.

Plots, drawn with matplotlib's Agg/SVG backend and inlined so the file stands alone: time per
stage (compute vs served from cache), device utilisation over time, cache hit rate per stage.
Every figure is the whole run's (all its invocations, see `summary`), so a resumed run reports
and compares like an uninterrupted one. `compare_runs` is pure: two run.json summaries (and
their journals) in, rows out.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuplane.batch.errors import BatchError
from gpuplane.batch.journal import read_records


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.find("<svg") :]


def plots(summary: Mapping[str, Any]) -> dict[str, str]:
    """Title → inline SVG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    stages: Mapping[str, Any] = summary.get("stages", {})
    names = list(stages)
    out: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(names, [stages[n]["compute_s"] for n in names], label="compute (s)")
    ax.barh(names, [stages[n]["device_s"] for n in names], label="device-seconds", alpha=0.6)
    ax.set_xlabel("seconds, summed over clips")
    ax.legend(loc="lower right")
    ax.invert_yaxis()
    out["Time per stage"] = _svg(fig)
    plt.close(fig)

    tl = summary.get("timeline", {})
    util: Mapping[str, list[float]] = tl.get("utilisation", {})
    fig, ax = plt.subplots(figsize=(7, 3))
    for dev, row in util.items():
        label = dev if dev != "cpu" else "cpu-only stages (tasks running)"
        ax.plot([i * tl["bin_s"] for i in range(len(row))], row, label=label)
    ax.set_xlabel("seconds of running time (invocations end to end)")
    ax.set_ylabel("busy share of the card")
    if util:
        ax.legend(loc="upper right")
    out["Device utilisation over time"] = _svg(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(names, [stages[n]["cache"]["hit_rate"] for n in names])
    ax.set_ylim(0, 1)
    ax.set_ylabel("cache hit rate")
    ax.tick_params(axis="x", rotation=30)
    out["Cache hit rate per stage"] = _svg(fig)
    plt.close(fig)
    return out


def _table(rows: list[list[Any]], head: list[str]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def stage_rows(summary: Mapping[str, Any]) -> list[list[Any]]:
    rows = []
    for name, m in summary.get("stages", {}).items():
        rows.append(
            [
                name,
                summary.get("versions", {}).get(name, ""),
                m["computed"],
                m["cached"],
                m["errors"],
                f"{m['compute_s']:.2f}",
                f"{m['device_s']:.2f}",
                f"{m['cache']['hit_rate']:.0%}",
                summary.get("plan", {}).get("replicas", {}).get(name, ""),
            ]
        )
    return rows


STAGE_HEAD = [
    "stage", "version", "computed", "cached", "errors", "compute s", "device s", "hit rate",
    "replicas",
]  # fmt: skip


def invocation_rows(summary: Mapping[str, Any]) -> list[list[Any]]:
    rows = []
    for e in summary.get("invocations", []):  # None: unknown, the invocation was killed
        wall, skipped = e["wall_s"], e["skipped_already_done"]
        started = datetime.fromtimestamp(e["started_at"], UTC).isoformat(timespec="seconds")
        rows.append(
            [e["invocation"], started, e["status"], e["done"], "-" if skipped is None else skipped,
             e["errors"], "-" if wall is None else f"{wall:.2f}"]
        )  # fmt: skip
    return rows


INVOCATION_HEAD = ["#", "started (UTC)", "status", "clips done", "skipped", "errors", "wall s"]


def write_report(summary: Mapping[str, Any], path: Path) -> Path:
    """Write a standalone HTML report for one run; returns its path."""
    parts = [
        "<!doctype html><meta charset=utf-8>",
        f"<title>gpuplane batch: {html.escape(summary['pipeline'])}</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}</style>",
        f"<h1>{html.escape(summary['pipeline'])} — {html.escape(summary.get('status', ''))}</h1>",
    ]
    clips = summary.get("clips", {})
    overview = [
        ["clips done", clips.get("done", 0)],
        ["clips failed, not done", clips.get("errors", 0)],
        ["invocations", clips.get("invocations", 0)],
        ["wall time (s), all invocations", f"{summary.get('wall_s', 0):.2f}"],
        ["throughput (clips/s)", f"{summary.get('throughput_clips_per_s', 0):.3f}"],
        ["device-seconds", f"{summary.get('device_seconds', 0):.2f}"],
        ["runner", json.dumps(summary.get("runner", {}))],
        ["plan bottleneck", summary.get("plan", {}).get("bottleneck", "")],
    ]
    parts.append(_table(overview, ["", ""]))
    if summary.get("aggregate"):
        rows = [[k, v] for k, v in summary["aggregate"].items()]
        parts.append("<h2>Aggregate over all clips</h2>" + _table(rows, ["metric", "value"]))
    parts.append("<h2>Stages</h2>" + _table(stage_rows(summary), STAGE_HEAD))
    parts.append("<h2>Invocations</h2>" + _table(invocation_rows(summary), INVOCATION_HEAD))
    for title, svg in plots(summary).items():
        parts.append(f"<h2>{html.escape(title)}</h2>{svg}")
    replicas = summary.get("plan", {}).get("placements", [])  # run.json's key for them
    rows = [[r["module"], r["replica"], r["device"], f"{r['share']:.2f}"] for r in replicas]
    parts.append("<h2>Packing plan</h2>" + _table(rows, ["module", "replica", "device", "share"]))
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def load_run(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.exists():
        raise BatchError(f"{run_dir} is not a run directory (no run.json); pass a --out of a run")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def compare_runs(a_dir: Path, b_dir: Path) -> dict[str, Any]:
    """Totals side by side, per-stage changes, and how many clips' results differ per module."""
    a, b = load_run(a_dir), load_run(b_dir)

    def ratio(x: float, y: float) -> float | None:
        return y / x if x else None

    totals = {
        k: {"a": a.get(k, 0.0), "b": b.get(k, 0.0), "b_over_a": ratio(a.get(k, 0.0), b.get(k, 0.0))}
        for k in ("wall_s", "throughput_clips_per_s", "device_seconds")
    }
    stages = {}
    for name in dict.fromkeys([*a.get("stages", {}), *b.get("stages", {})]):
        sa, sb = a["stages"].get(name), b["stages"].get(name)
        stages[name] = {
            "version": [a.get("versions", {}).get(name), b.get("versions", {}).get(name)],
            "computed": [sa and sa["computed"], sb and sb["computed"]],
            "hit_rate": [sa and sa["cache"]["hit_rate"], sb and sb["cache"]["hit_rate"]],
            "device_s": [sa and sa["device_s"], sb and sb["device_s"]],
        }
    ra, rb = read_records(a_dir / "results.jsonl"), read_records(b_dir / "results.jsonl")
    common = ra.keys() & rb.keys()
    changed: dict[str, int] = {}
    for clip in common:
        oa, ob = ra[clip].get("out", {}), rb[clip].get("out", {})
        for mod in oa.keys() | ob.keys():
            if oa.get(mod) != ob.get(mod):
                changed[mod] = changed.get(mod, 0) + 1
    return {
        "a": str(a_dir),
        "b": str(b_dir),
        "totals": totals,
        "stages": stages,
        "clips": {
            "common": len(common),
            "only_a": len(ra.keys() - rb.keys()),
            "only_b": len(rb.keys() - ra.keys()),
        },
        "changed_results": dict(sorted(changed.items())),
    }
