"""Plots of a report (PNG at 2x, or SVG): the verdict figure, throughput and per-request speed against load, latency
CDFs, acceptance, server queues."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never a display (CI, ssh)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rig.analysis.report import Report  # noqa: E402
from rig.analysis.verdict import safe_name  # noqa: E402
from rig.contracts import CampaignRow  # noqa: E402

DPI = 220  # 2x the 110 dpi the figures are laid out for: crisp on high-density screens


def _level(row: CampaignRow) -> float | None:
    lv = row.level
    return float(lv) if lv is not None else None


def _config_labels(rows: list[CampaignRow]) -> dict[Any, str]:
    """'steps=N' per server configuration, with the config id when two configurations share a steps value."""
    by_steps: dict[Any, set] = defaultdict(set)
    for r in rows:
        by_steps[r.get("steps")].add(r.get("server_config"))
    return {
        r.get("server_config"): (
            f"steps={r.get('steps')}"
            if len(by_steps[r.get("steps")]) == 1
            else f"steps={r.get('steps')} {r.get('server_config')}"
        )
        for r in rows
    }


def _lines(rows: list[CampaignRow], key: str) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(workload, config label) -> (levels, mean of ``key`` over repeats) for rows that have both."""
    labels = _config_labels(rows)
    acc: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        lv, y = _level(r), r.get(key)
        if lv is not None and y is not None:
            acc[(str(r.get("workload")), labels[r.get("server_config")])][lv].append(float(y))
    out = {}
    for k, pts in acc.items():
        xs = np.array(sorted(pts))
        out[k] = (xs, np.array([np.mean(pts[x]) for x in xs]))
    return out


def _xlabel(rows: list[CampaignRow]) -> str:
    return "concurrency" if all(r.get("load_mode") in (None, "closed") for r in rows) else "concurrency / rate (req/s)"


def _save(fig: plt.Figure, stem: Path, formats: tuple[str, ...]) -> list[Path]:
    """The figure written as ``stem.<format>`` for each format (SVG keeps its text as text), then closed."""
    fig.tight_layout()
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            fig.savefig(path, dpi=DPI, metadata={"Date": None} if fmt == "svg" else None)
        paths.append(path)
    plt.close(fig)
    return paths


def plot_throughput(report: Report) -> plt.Figure:
    """Aggregate tok/s against concurrency (or rate), one line per steps, one panel per workload."""
    lines = _lines(report.campaign, "aggregate_tok_s")
    workloads = sorted({w for w, _ in lines}) or ["(no data)"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, wl in zip(axes[0], workloads, strict=True):
        for (w, label), (x, y) in sorted(lines.items()):
            if w == wl:
                ax.plot(x, y, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set(title=f"{wl}: aggregate throughput", xlabel=_xlabel(report.campaign), ylabel="tok/s")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return fig


def plot_energy(report: Report) -> plt.Figure:
    """J/token and mean power against load, one line per (workload, steps); titled SIMULATED for the sim's model."""
    sim = any("simulated" in str(r.get("energy_source") or "") for r in report.campaign)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title, unit in (
        (axes[0], "j_per_token", "energy per output token", "J/token"),
        (axes[1], "mean_power_w", "mean power, all GPUs", "W"),
    ):
        for (w, label), (x, y) in sorted(_lines(report.campaign, key).items()):
            ax.plot(x, y, marker="o", label=f"{w} {label}")
        ax.set_xscale("log", base=2)
        ax.set(title=title + (" (SIMULATED)" if sim else ""), xlabel=_xlabel(report.campaign), ylabel=unit)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def plot_request_speed(report: Report) -> plt.Figure:
    """Per-request tok/s (from send) and decode tok/s against load, one line per (workload, steps)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in (
        (axes[0], "per_request_tok_s", "per-request tok/s (from send)"),
        (axes[1], "decode_tok_s", "decode tok/s (after first token)"),
    ):
        for (w, label), (x, y) in sorted(_lines(report.campaign, key).items()):
            ax.plot(x, y, marker="o", label=f"{w} {label}")
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel=_xlabel(report.campaign), ylabel="tok/s")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def plot_latency_cdfs(report: Report, rows: list[CampaignRow], title: str) -> plt.Figure:
    """CDFs of TTFT, TPOT, ITL and E2E, one line per point of ``rows`` (one workload and load level)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    labels = _config_labels(report.campaign)
    repeats = len({r.get("repeat") for r in rows}) > 1
    for ax, metric in zip(axes.ravel(), ("ttft", "tpot", "itl", "e2e"), strict=False):
        for r in rows:
            x, f = report.cdfs.get(r["point"], {}).get(metric, (np.empty(0), np.empty(0)))
            if x.size:
                label = labels[r.get("server_config")] + (f" r{r.get('repeat')}" if repeats else "")
                ax.plot(x * 1e3, f, label=label, linewidth=1.2)
        ax.set(title=f"{title}: {metric.upper()} CDF", xlabel="ms", ylabel="fraction")
        if metric in ("ttft", "e2e"):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def plot_acceptance(report: Report) -> plt.Figure:
    """Acceptance length against steps, one line per (workload, load level)."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in report.acceptance:
        steps, length = r["steps"], r["accept_length"]
        if length is not None and steps is not None:
            acc[f"{r['workload']} @ {r['level']}"][int(steps)].append(float(length))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, pts in sorted(acc.items()):
        xs = sorted(pts)
        ax.plot(xs, [np.mean(pts[x]) for x in xs], marker="o", label=label)
    ax.set(title="acceptance length vs steps", xlabel="speculative steps", ylabel="tokens per verify step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return fig


def _server_panel(ax: plt.Axes, report: Report, point: str) -> bool:
    """Running and queued requests (and KV token usage) over one point; False if nothing was scraped."""
    s = report.series.get(point)
    if not s or (s["running"].empty and s["queued"].empty):
        ax.set_title(f"{point}: no server samples", fontsize=9)
        ax.axis("off")
        return False
    t0 = min(x.ts[0] for x in (s["running"], s["queued"], s["token_usage"]) if not x.empty)
    for name, style in (("running", "-"), ("queued", "--")):
        if not s[name].empty:
            ax.plot(s[name].ts - t0, s[name].values, style, drawstyle="steps-post", label=f"{name} requests")
    cap = next((r.get("max_running_requests") for r in report.server if r["point"] == point), None)
    top = max([float(np.nanmax(s[n].values)) for n in ("running", "queued") if not s[n].empty] + [float(cap or 0), 1.0])
    if cap:
        ax.axhline(cap, color="grey", linestyle=":", label=f"max running (eff.) = {cap}")
    ax.set_ylim(0, top * 1.15)
    ax.set_title(point, fontsize=9)
    ax.set(xlabel="seconds", ylabel="requests")
    ax.grid(alpha=0.3)
    if not s["token_usage"].empty:
        ax2 = ax.twinx()
        ax2.plot(s["token_usage"].ts - t0, s["token_usage"].values, color="tab:green", alpha=0.6, label="token usage")
        ax2.set_ylabel("KV token usage")
        ax2.set_ylim(0, max(1.0, float(np.nanmax(s["token_usage"].values))))
        ax2.legend(loc="upper right", fontsize=6)
    ax.legend(loc="upper left", fontsize=6)
    return True


def plot_server(report: Report, rows: list[CampaignRow]) -> plt.Figure | None:
    """Server running/queued requests over time, one panel per point of a (configuration, workload) group."""
    points = [
        r["point"] for r in rows if report.series.get(r["point"]) and not report.series[r["point"]]["running"].empty
    ]
    if not points:
        return None
    cols = min(3, len(points))
    nrows = -(-len(points) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.8 * cols, 3.4 * nrows), squeeze=False)
    for ax in axes.ravel()[len(points) :]:
        ax.axis("off")
    for ax, point in zip(axes.ravel(), points, strict=False):
        _server_panel(ax, report, point)
    r0 = rows[0]
    fig.suptitle(f"server during {r0.get('workload')} · {r0.get('server_config')} (steps={r0.get('steps')})")
    return fig


def plot_frontier(report: Report, workload: str) -> plt.Figure:
    """Decode tok/s per request against aggregate tok/s per GPU: one curve per configuration (labelled by load
    level), the Pareto frontier drawn through the points no other point beats on both axes."""
    rows = [
        r
        for r in report.campaign
        if str(r.get("workload")) == workload
        and r.get("tok_s_per_gpu") is not None
        and r.get("decode_tok_s") is not None
    ]
    labels = _config_labels(report.campaign)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    by_cfg: dict[str, list[CampaignRow]] = defaultdict(list)
    for r in rows:
        by_cfg[labels[r.get("server_config")]].append(r)
    for label, pts in sorted(by_cfg.items()):
        pts = sorted(pts, key=lambda r: _level(r) or 0)
        x = [r["tok_s_per_gpu"] for r in pts]
        y = [r["decode_tok_s"] for r in pts]
        (line,) = ax.plot(x, y, "o-", alpha=0.75, label=label, markersize=4)
        for r in pts:
            ax.annotate(
                f"{_level(r):g}" if _level(r) is not None else "",
                (r["tok_s_per_gpu"], r["decode_tok_s"]),
                textcoords="offset points",
                xytext=(3, 3),
                fontsize=7,
                color=line.get_color(),
            )
    front = sorted((r for r in rows if r.get("on_frontier")), key=lambda r: r["tok_s_per_gpu"])
    if front:
        ax.plot(
            [r["tok_s_per_gpu"] for r in front],
            [r["decode_tok_s"] for r in front],
            "-",
            color="black",
            linewidth=2,
            alpha=0.35,
            zorder=0,
            label="Pareto frontier",
        )
        ax.scatter(
            [r["tok_s_per_gpu"] for r in front],
            [r["decode_tok_s"] for r in front],
            s=80,
            facecolors="none",
            edgecolors="black",
            zorder=3,
        )
    ax.set(
        title=f"{workload}: speed per user vs throughput per GPU (labels: load level)",
        xlabel="aggregate tok/s per GPU",
        ylabel="decode tok/s per request",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# A plot job: a module-level function and its arguments after the report (workers get the report by fork).
Job = tuple[Callable[..., Any], tuple[Any, ...]]
_FORKED_REPORT: Report | None = None
MAX_WORKERS = 4


def _run_job(job: Job) -> Any:
    fn, args = job
    assert _FORKED_REPORT is not None
    return fn(_FORKED_REPORT, *args)


def render_jobs(report: Report, jobs: list[Job]) -> list[Any]:
    """Each job's result in order. Matplotlib holds the GIL while it draws, so on several CPUs the plots are drawn in
    forked worker processes (they inherit the report; nothing is pickled but the paths); one by one otherwise.

    Fork only copies the calling thread: a process with other threads (a test runner, a Ray client) may fork a child
    holding a lock it can never take (seen: a worker segfaulting inside matplotlib). So the pool is used only from a
    single-threaded process, and a worker that dies (BrokenProcessPool) makes the plots be drawn here instead of
    hanging the report, as ``multiprocessing.Pool.map`` would.
    """
    global _FORKED_REPORT
    workers = min(len(jobs), os.cpu_count() or 1, MAX_WORKERS)
    if workers < 2 or threading.active_count() > 1 or "fork" not in mp.get_all_start_methods():
        return [fn(report, *args) for fn, args in jobs]
    _FORKED_REPORT = report
    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
            return list(pool.map(_run_job, jobs, chunksize=1))
    except BrokenProcessPool:
        return [fn(report, *args) for fn, args in jobs]
    finally:
        _FORKED_REPORT = None


def draw_plot(
    report: Report, plot: Callable[..., plt.Figure | None], args: tuple[Any, ...], stem: Path, formats: tuple[str, ...]
) -> list[Path]:
    """One plot drawn and written in each format (nothing when the plot has nothing to show)."""
    fig = plot(report, *args)
    return [] if fig is None else _save(fig, stem, formats)


def plot_jobs(report: Report, out_dir: Path) -> list[tuple[Callable[..., plt.Figure | None], tuple[Any, ...], Path]]:
    """Every plot of the report: (plot function, its arguments after the report, file stem), the verdict's first."""
    from rig.analysis.verdict import figure_name
    from rig.analysis.verdict_plot import plot_verdict, verdict_groups

    jobs: list[tuple[Callable[..., plt.Figure | None], tuple[Any, ...], Path]] = [
        (plot_verdict, (wl, mode), out_dir / figure_name(wl, mode)) for wl, mode in verdict_groups(report)
    ]
    jobs += [
        (plot_throughput, (), out_dir / "throughput_vs_concurrency"),
        (plot_request_speed, (), out_dir / "request_speed_vs_concurrency"),
        (plot_acceptance, (), out_dir / "acceptance_vs_steps"),
    ]
    if report.energy:
        jobs.append((plot_energy, (), out_dir / "energy_vs_load"))
    for wl in sorted({str(r.get("workload")) for r in report.campaign if r.get("tok_s_per_gpu") is not None}):
        jobs.append((plot_frontier, (wl,), out_dir / f"frontier_{safe_name(wl)}"))
    by_level: dict[tuple[str, float | None], list[CampaignRow]] = defaultdict(list)
    for r in report.campaign:
        by_level[(str(r.get("workload")), _level(r))].append(r)
    for (wl, level), rows in sorted(by_level.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        closed = all(r.get("load_mode") in (None, "closed") for r in rows)
        tag = ("c" if closed else "rate") + (f"{level:g}" if level is not None else "none")
        title = f"{wl} @ {'C=' if closed else 'rate='}{level:g}" if level is not None else wl
        jobs.append((plot_latency_cdfs, (rows, title), out_dir / f"latency_cdf_{safe_name(wl)}_{tag}"))
    groups: dict[tuple[Any, Any], list[CampaignRow]] = defaultdict(list)
    for r in report.campaign:
        groups[(r.get("server_config"), r.get("workload"))].append(r)
    for (config, workload), rows in groups.items():
        jobs.append((plot_server, (rows,), out_dir / f"server_{safe_name(str(config))}_{safe_name(str(workload))}"))
    if report.timelines:
        from rig.analysis.timeline_plot import plot_timeline

        jobs += [(plot_timeline, (tl.point,), out_dir / f"timeline_{safe_name(tl.point)}") for tl in report.timelines]
    return jobs


def write_plots(report: Report, out_dir: Path, formats: tuple[str, ...] = ("png",)) -> list[Path]:
    """Every plot of the report in ``out_dir``, one file per format (png: at 2x; svg: vector, its text as text);
    returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs: list[Job] = [(draw_plot, (plot, args, stem, formats)) for plot, args, stem in plot_jobs(report, out_dir)]
    return [p for paths in render_jobs(report, jobs) for p in paths]
