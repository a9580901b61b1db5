"""The figure behind a verdict: aggregate throughput and per-request decode speed against load, one line per
setting, with the SLO limit, the points that miss it, the flagged points and the crossovers drawn."""

from __future__ import annotations

from collections import defaultdict

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never a display (CI, ssh)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rig.analysis.report import Report  # noqa: E402
from rig.analysis.verdict import setting_labels, verdict  # noqa: E402
from rig.contracts import CampaignRow  # noqa: E402

PANELS = (
    ("aggregate_tok_s", "aggregate throughput", "tok/s"),
    ("decode_tok_s", "per-request decode speed (after the first token)", "tok/s per request"),
)


def verdict_groups(report: Report) -> list[tuple[str, str]]:
    """The (workload, load mode) pairs with a measured level, in the verdict's order."""
    return sorted({(str(r.workload), str(r.load_mode)) for r in report.campaign if r.level is not None})


def _mean_by_level(rows: list[CampaignRow], key: str) -> tuple[list[float], list[float]]:
    acc: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        v = r.get(key)
        if r.level is not None and v is not None:
            acc[float(r.level)].append(float(v))
    xs = sorted(acc)
    return xs, [float(np.mean(acc[x])) for x in xs]


def _tpot_line(report: Report) -> tuple[float, str] | None:
    """A TPOT SLO as the decode speed it allows (1 / limit), with its legend text."""
    tpot = [s for s in report.slos if s.metric == "tpot"]
    if not tpot:
        return None
    limit = min(s.limit_s for s in tpot)
    return 1.0 / limit, f"SLO p{report.slo_percentile:g} TPOT ≤ {limit * 1e3:g} ms (≥ {1 / limit:,.0f} tok/s)"


def _panel(ax: plt.Axes, report: Report, rows: list[CampaignRow], key: str, colors: dict[str, str]) -> int:
    """One line per setting through its valid points (filled: meets the SLOs or none given; hollow: misses them),
    its flagged points as crosses; returns the number of lines."""
    from rig.analysis.frontier import valid

    labels = setting_labels(report.campaign, report.run)
    by_setting: dict[str, list[CampaignRow]] = defaultdict(list)
    for r in rows:
        by_setting[labels[r.server_config]].append(r)
    for label, mine in sorted(by_setting.items()):
        good = [r for r in mine if valid(r)]
        xs, ys = _mean_by_level(good, key)
        ax.plot(xs, ys, "-", color=colors[label], label=label, linewidth=1.8)
        meets = [r for r in good if r.slo_meets is not False]
        misses = [r for r in good if r.slo_meets is False]
        for sel, face in ((meets, colors[label]), (misses, "white")):
            mx, my = _mean_by_level(sel, key)
            ax.plot(mx, my, "o", color=colors[label], markerfacecolor=face, markersize=6, zorder=3)
        bx, by = _mean_by_level([r for r in mine if not valid(r)], key)
        ax.plot(bx, by, "x", color=colors[label], markersize=8, markeredgewidth=2, zorder=3)
    return len(by_setting)


def _legend_extras(ax: plt.Axes, rows: list[CampaignRow], slo: bool) -> None:
    from rig.analysis.frontier import valid

    if slo and any(r.slo_meets is False for r in rows):
        ax.plot([], [], "o", color="grey", markerfacecolor="white", label="misses the SLOs")
    if any(not valid(r) for r in rows):
        ax.plot([], [], "x", color="grey", markeredgewidth=2, label="flagged invalid")


def plot_verdict(report: Report, workload: str, load_mode: str) -> plt.Figure:
    """Two stacked panels (they read at a phone's width as at a desktop's): throughput, then decode speed."""
    rows = [r for r in report.campaign if str(r.workload) == workload and str(r.load_mode) == load_mode]
    labels = sorted(set(setting_labels(report.campaign, report.run).values()))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {lab: cycle[i % len(cycle)] for i, lab in enumerate(labels)}
    w = next((x for x in verdict(report).workloads if (x.workload, x.load_mode) == (workload, load_mode)), None)
    levels = sorted({float(r.level) for r in rows if r.level is not None})
    closed = load_mode in ("closed", "None")
    with plt.rc_context({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}):
        fig, axes = plt.subplots(2, 1, figsize=(5.6, 6.8), sharex=True)
        for ax, (key, title, unit) in zip(axes, PANELS, strict=True):
            n = _panel(ax, report, rows, key, colors)
            ax.set_title(title, loc="left")
            ax.set_ylabel(unit)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            for c in w.crossovers if w else []:
                ax.axvline(c.level, color="black", linestyle=":", linewidth=1)
                ax.annotate(
                    f"{c.was} → {c.now}",
                    (c.level, 1),
                    xycoords=("data", "axes fraction"),
                    xytext=(-4, -12),
                    textcoords="offset points",
                    ha="right",
                    fontsize=9,
                )
        tpot = _tpot_line(report)
        if tpot is not None:
            axes[1].axhline(tpot[0], color="tab:red", linestyle="--", linewidth=1.2, label=tpot[1])
        _legend_extras(axes[1], rows, bool(report.slos))
        axes[0].legend(loc="best")
        handles, texts = axes[1].get_legend_handles_labels()
        if len(handles) > n:  # the SLO line and the marker keys (the settings are in the top legend)
            axes[1].legend(handles[n:], texts[n:], loc="best")
        ax = axes[1]
        if len(levels) > 1 and min(levels) > 0:
            ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(levels))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{x:g}" for x in levels]))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.margins(x=0.06)
        ax.set_xlabel("concurrency" if closed else "rate (req/s)")
        fig.suptitle(f"{workload} ({'closed' if closed else 'open'} loop)", x=0.02, ha="left", fontweight="bold")
    return fig
