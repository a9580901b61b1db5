"""The plot of a load profile's point: throughput and running requests, active speculative steps and power, over
time, with the phase boundaries and each phase's steady span."""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rig.analysis.timeline import Timeline, Window  # noqa: E402

if TYPE_CHECKING:
    from rig.analysis.report import Report


def _steps(windows: list[Window], key: str) -> tuple[np.ndarray, np.ndarray]:
    """A window series as a step line: x at every window edge, y held over each window (nan: no value)."""
    xs = np.array([w.start_s for w in windows] + [windows[-1].end_s])
    ys = np.array([np.nan if getattr(w, key) is None else getattr(w, key) for w in windows], dtype=float)
    return xs, np.append(ys, ys[-1:])


def _phases(ax: plt.Axes, tl: Timeline, labels: bool) -> None:
    for p in tl.phases:
        ax.axvline(p.start_s, color="0.4", lw=0.8, ls="--")
        if p.steady_from_s is not None and p.steady_to_s is not None:
            ax.axvspan(p.steady_from_s, p.steady_to_s, color="tab:green", alpha=0.07, lw=0)
        if labels:
            ax.text(p.start_s, 1.0, f" {p.label}", transform=ax.get_xaxis_transform(), va="bottom", fontsize=7)


def timeline_figure(tl: Timeline) -> plt.Figure:
    """Top: output tok/s and running requests; bottom: active speculative steps and GPU power."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    if tl.windows:
        top.step(*_steps(tl.windows, "output_tok_s"), where="post", color="tab:blue", label="output tok/s")
        run_ax = top.twinx()
        run_ax.step(*_steps(tl.windows, "running"), where="post", color="tab:orange", label="running requests")
        run_ax.set_ylabel("running requests", color="tab:orange")
        bottom.step(*_steps(tl.windows, "spec_steps"), where="post", color="tab:purple", label="active steps")
        if any(w.power_w is not None for w in tl.windows):
            pow_ax = bottom.twinx()
            pow_ax.step(*_steps(tl.windows, "power_w"), where="post", color="tab:red", label="power")
            pow_ax.set_ylabel("GPU power (W)", color="tab:red")
    _phases(top, tl, labels=True)
    _phases(bottom, tl, labels=False)
    top.set(ylabel="output tok/s")
    top.set_title(f"{tl.point}: load profile ({tl.window_s:g} s windows; shaded: steady state)", fontsize=9, pad=14)
    bottom.set(ylabel="active speculative steps", xlabel="seconds from the point's start")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def plot_timeline(report: Report, point: str) -> plt.Figure | None:
    """The timeline figure of one profiled point of the report (None if it has none)."""
    tl = next((t for t in report.timelines if t.point == point), None)
    return timeline_figure(tl) if tl is not None else None
