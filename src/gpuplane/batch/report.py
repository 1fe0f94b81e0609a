"""The run report (HTML with embedded SVG plots) and the comparison of two runs.

Plots, drawn with matplotlib's Agg/SVG backend and inlined so the file stands alone: time per
stage (compute vs served from cache), device utilisation over time, cache hit rate per stage.
Then a per-clip table (each clip's stage outcomes and reduced metrics, from the journal and the
error log; sortable by a few lines of inline script, no external assets). Every figure is the
whole run's (all its invocations, see `summary`), so a resumed run reports and compares like an
uninterrupted one. `compare_runs` is pure: two run.json summaries (and their journals) in, rows
out.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuplane.batch.cache import stage_dir
from gpuplane.batch.errors import BatchError
from gpuplane.batch.journal import iter_records, read_records
from gpuplane.batch.summary import ERRORS, JOURNAL, RUN, read_errors

MAX_CLIP_ROWS = 1000
"""The per-clip table's bound, so a 100,000-clip run's report stays small; results.jsonl has all."""

SORT_JS = """
document.querySelectorAll("table.sortable th").forEach((th, i) => th.onclick = () => {
  const body = th.closest("table").tBodies[0], up = th.dataset.dir !== "asc";
  th.dataset.dir = up ? "asc" : "desc";
  const key = r => {
    const t = r.cells[i].textContent, n = Number(t);
    return t && !isNaN(n) ? n : t;
  };
  const rows = [...body.rows].sort((a, b) => {
    const x = key(a), y = key(b);
    const c = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : typeof x === "number" ? -1 : 1;
    return up ? c : -c;
  });
  body.append(...rows);
});
"""


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


class Markup(str):
    """A table cell that is HTML already (a link), not text to escape."""

    __slots__ = ()


def _cell(value: Any) -> str:
    return value if isinstance(value, Markup) else html.escape(str(value))


def _table(rows: list[list[Any]], head: list[str] | None, cls: str = "") -> str:
    """A table; `head` None: no header row (a two-column list of names and values)."""
    th = "" if head is None else "<thead><tr>" + "".join(f"<th>{_cell(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}>{th + '</tr></thead>' if th else ''}<tbody>{body}</tbody></table>"


def runner_words(summary: Mapping[str, Any]) -> str:
    """The runner as a reader says it: "local processes, 4 workers", "Ray at HOST:PORT, ..."."""
    r = summary.get("runner", {})
    if r.get("runner") == "local":
        kind = "threads" if r.get("threads") else "processes"
        pinned = ", a pool per card" if r.get("pin_devices") else ""
        return f"local {kind}, {r.get('capacity')} workers{pinned}"
    if r.get("runner") == "ray":
        actors = len(summary.get("plan", {}).get("placements", []))  # one per replica
        where = r.get("address") or "RAY_ADDRESS, else a local cluster"
        return f"Ray at {where}, {actors} actors"
    return str(r.get("runner", "unknown"))


def cache_link(cache_url: str | None, stage: str, version: str) -> Markup:
    """A link to the directory of a stage version's cache entries (a local one opens in the
    browser)."""
    if not cache_url:
        return Markup("no cache")
    where = stage_dir(cache_url, stage, version)
    if "://" in where and not where.startswith("file://"):
        return Markup(f"<code>{html.escape(where)}</code>")
    href = Path(where.removeprefix("file://")).resolve().as_uri() + "/"
    return Markup(f'<a href="{html.escape(href)}">{html.escape(where)}</a>')


def _flat(out: Mapping[str, Any]) -> dict[str, Any]:
    """A clip's reduced output one level flat: {"lane_rules": {"departures": 3}} becomes
    {"lane_rules.departures": 3}, one column each."""
    flat: dict[str, Any] = {}
    for k, v in out.items():
        if isinstance(v, Mapping):
            flat |= {f"{k}.{k2}": v2 for k2, v2 in v.items()}
        else:
            flat[k] = v
    return flat


def _metric(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value, default=str)


def clip_rows(summary: Mapping[str, Any], run_dir: Path) -> tuple[list[str], list[list[Any]]]:
    """The per-clip table (head, rows): each clip's status, attempts, every stage's outcome
    (computed, cached, failed, or - where it did not run) and its reduced metrics; at most
    `MAX_CLIP_ROWS` clips, the finished ones first."""
    stages = list(summary.get("stages", {}))
    errors = read_errors(run_dir / ERRORS)
    unresolved = set(errors.stage_of)  # failed, and not finished by a later attempt
    records: list[dict[str, Any]] = []
    for rec in iter_records(run_dir / JOURNAL):
        unresolved.discard(rec["clip"])
        if len(records) < MAX_CLIP_ROWS:
            records.append(rec)
    outs = {r["clip"]: _flat(r.get("out") or {}) for r in records}
    metrics = list(dict.fromkeys(k for out in outs.values() for k in out))
    rows: list[list[Any]] = []
    for rec in sorted(records, key=lambda r: r["clip"]):
        hits, out = set(rec.get("hits", ())), outs[rec["clip"]]
        outcome = ["cached" if n in hits else "computed" for n in stages]
        rows.append([rec["clip"], "done", rec.get("attempts", 1), *outcome,
                     *(_metric(out[k]) if k in out else "" for k in metrics)])  # fmt: skip
    for clip in sorted(unresolved)[: MAX_CLIP_ROWS - len(rows)]:
        stage = errors.stage_of[clip]
        outcome = ["failed" if n == stage else "-" for n in stages]
        rows.append([clip, f"failed at {stage}", errors.per_clip[clip], *outcome,
                     *([""] * len(metrics))])  # fmt: skip
    return ["clip", "status", "attempts", *stages, *(f"{k} (reduced)" for k in metrics)], rows


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


def write_report(summary: Mapping[str, Any], run_dir: Path, path: Path | None = None) -> Path:
    """Write a standalone HTML report of the run in `run_dir` (its journal and error log give
    the per-clip table) to `path`, by default the run directory's report.html; returns it."""
    path = path or run_dir / "report.html"
    parts = [
        "<!doctype html><meta charset=utf-8>",
        f"<title>gpuplane batch: {html.escape(summary['pipeline'])}</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}"
        "table.sortable th{cursor:pointer}</style>",
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
        ["runner", runner_words(summary)],
        ["plan bottleneck", summary.get("plan", {}).get("bottleneck", "")],
    ]
    parts.append(_table(overview, None))
    if summary.get("aggregate"):
        rows = [[k, "null (see run.json's nulls)" if v is None else v]
                for k, v in summary["aggregate"].items()]  # fmt: skip
        parts.append("<h2>Aggregate over all clips</h2>" + _table(rows, ["metric", "value"]))
    versions, url = summary.get("versions", {}), summary.get("cache_url")
    links = [cache_link(url, name, versions.get(name, "")) for name in summary.get("stages", {})]
    rows = [[*r, link] for r, link in zip(stage_rows(summary), links, strict=True)]
    parts.append("<h2>Stages</h2>" + _table(rows, [*STAGE_HEAD, "cache entries"]))
    parts.append("<h2>Invocations</h2>" + _table(invocation_rows(summary), INVOCATION_HEAD))
    for title, svg in plots(summary).items():
        parts.append(f"<h2>{html.escape(title)}</h2>{svg}")
    replicas = summary.get("plan", {}).get("placements", [])  # run.json's key for them
    rows = [[r["module"], r["replica"], r["device"], f"{r['share']:.2f}"] for r in replicas]
    parts.append("<h2>Packing plan</h2>" + _table(rows, ["module", "replica", "device", "share"]))
    head, rows = clip_rows(summary, run_dir)
    total = summary.get("clips", {}).get("done", 0) + summary.get("clips", {}).get("errors", 0)
    shown = f" (the first {len(rows)} of {total}; results.jsonl has every clip)"
    parts.append(f"<h2>Clips{shown if len(rows) < total else ''}</h2>")
    parts.append(_table(rows, head, "sortable clips") + f"<script>{SORT_JS}</script>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def load_run(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN
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
    ra, rb = read_records(a_dir / JOURNAL), read_records(b_dir / JOURNAL)
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
