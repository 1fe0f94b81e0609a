"""The audit's standalone HTML report: fleet allocated vs used over time, findings by team, the
thresholds, slice recommendations, the before/after card map and usage per team.

Plots are drawn with matplotlib (Agg) and embedded as SVG data URIs, so the file needs nothing
but itself (no external URL). The page is a Jinja2 template (`templates/report.html.j2`) with
autoescaping on.
"""

from __future__ import annotations

import base64
import io
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, PackageLoader

from gpuplane.audit.findings import FindingKind
from gpuplane.audit.pipeline import Audit
from gpuplane.audit.plan import RepackPlan
from gpuplane.audit.recommend import Replay
from gpuplane.audit.usage import UsageReport

MAX_ROWS = 2000  # recommendations listed (largest savings first); the rest are counted


def _uri(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue().encode()).decode()


def plots(audit: Audit) -> dict[str, str]:
    """The three figures as data URIs: fleet over time, findings by team, card map."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    line = audit.stats.timeline
    out: dict[str, str] = {}
    times = line.times.astype("datetime64[s]")
    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(times, line.allocated, label="GPUs allocated")
    ax.plot(times, line.used, label="GPUs used (compute)")
    card_gib = np.mean([c.card_mem_mib for c in audit.stats.cards]) / 1024
    ax.plot(times, line.mem_used_gib / card_gib, label="memory used (cards' worth)", alpha=0.7)
    ax.set_ylabel("cards")
    ax.legend(loc="upper right", fontsize=8)
    out["fleet"] = _uri(fig)
    plt.close(fig)

    kinds = [str(k) for k in FindingKind]
    teams = sorted({f.team or "(fleet)" for f in audit.findings})
    counts = Counter((f.team or "(fleet)", str(f.kind)) for f in audit.findings)
    fig, ax = plt.subplots(figsize=(10, 3.2))
    bottom = np.zeros(len(teams))
    for k in kinds:
        values = np.array([counts.get((t, k), 0) for t in teams], dtype=float)
        ax.bar(teams, values, bottom=bottom, label=k)
        bottom += values
    ax.set_ylabel("findings")
    ax.tick_params(axis="x", rotation=60, labelsize=8)
    ax.legend(fontsize=8, ncols=3)
    out["findings"] = _uri(fig)
    plt.close(fig)

    out["cardmap"] = _cardmap(audit.plan, plt)
    return out


def _cardmap(plan: RepackPlan, plt: Any) -> str:
    """Cards as cells, coloured by the share of each that is held, before and after."""
    cards = sorted(plan.card_mem)
    shares_before = _shares(plan.before, plan, before=True)
    shares_after = _shares(plan.after, plan, before=False)
    width = max(1, int(np.ceil(np.sqrt(len(cards) * 2))))
    rows = int(np.ceil(len(cards) / width))
    fig, axes = plt.subplots(1, 2, figsize=(10, max(2.0, rows * 0.25 + 1)))
    for ax, shares, title in ((axes[0], shares_before, "before"), (axes[1], shares_after, "after")):
        grid = np.full(rows * width, np.nan)
        grid[: len(cards)] = [shares.get(c, 0.0) for c in cards]
        im = ax.imshow(grid.reshape(rows, width), vmin=0, vmax=1, cmap="viridis")
        held = sum(1 for c in cards if shares.get(c, 0.0) > 0)
        ax.set_title(f"{title}: {held} cards held")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=axes, shrink=0.8, label="share of the card held")
    uri = _uri(fig)
    plt.close(fig)
    return uri


def _shares(card_map: Any, plan: RepackPlan, before: bool) -> dict[str, float]:
    moved = {m.workload: m for m in plan.moves}
    out: dict[str, float] = {}
    for card, workloads in card_map.items():
        total = 0.0
        for w in workloads:
            _, _, _, mem, milli = plan.placements[w]
            m = moved.get(w)
            if not before and m is not None and m.action in ("move", "resize"):
                mem, milli = m.mem_mib, m.gpu_milli
            total += max(milli / 1000, mem / max(plan.card_mem.get(card, mem), 1))
        out[card] = min(total, 1.0)
    return out


def render(audit: Audit, usage: UsageReport, replay: Replay | None = None) -> str:
    """The report as one HTML string."""
    env = Environment(
        # every template here is HTML; its name ends .j2, which select_autoescape() leaves raw
        loader=PackageLoader("gpuplane.audit", "templates"),
        autoescape=True,
    )
    by_team: dict[str, Counter[str]] = {}
    for f in audit.findings:
        by_team.setdefault(f.team or "(fleet)", Counter())[str(f.kind)] += 1
    recs = sorted(
        audit.recommendations.values(), key=lambda r: (r.share - r.alloc_share, r.workload)
    )
    w = audit.stats.window
    span = (
        f"{datetime.fromtimestamp(w.start_s, UTC):%Y-%m-%d %H:%M} to "
        f"{datetime.fromtimestamp(w.end_s, UTC):%Y-%m-%d %H:%M} UTC, one sample per {w.step_s} s"
    )
    replay_text = (
        "not run"
        if replay is None
        else f"{replay.samples} samples, {replay.exceeded} recommendations exceeded in memory, "
        f"{len(replay.throttled)} workloads would be throttled in some minute"
    )
    return env.get_template("report.html.j2").render(
        plan=audit.plan,
        moves=sum(1 for m in audit.plan.moves if m.action == "move"),
        window=span,
        replay=replay_text,
        plots=plots(audit),
        kinds=[str(k) for k in FindingKind],
        by_team=sorted(by_team.items()),
        traffic=audit.traffic,
        settings=sorted(audit.settings.model_dump().items()),
        recs=recs[:MAX_ROWS],
        fraction=audit.settings.slice_fraction,
        usage=usage,
    )


def write_report(
    audit: Audit, usage: UsageReport, path: Path, replay: Replay | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(audit, usage, replay))
    return path
