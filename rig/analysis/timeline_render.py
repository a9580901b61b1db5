"""The timeline of a load profile's points for the terminal: per phase the steady state and time to adapt, then
the windows."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from rig.analysis.timeline import Timeline


def _f(x: float | None, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


PHASE_HEADERS = (
    "Phase",
    "Load",
    "Span (s)",
    "Steady (s)",
    "Output tok/s",
    "TTFT p50 ms",
    "TPOT p50 ms",
    "Accept len",
    "Running",
    "Active steps",
    "Power W",
    "Steps adapt s",
    "Tok/s adapt s",
    "Excluded",
)


def phase_cells(tl: Timeline) -> list[list[str]]:
    """The phase table's cells, one list per phase (terminal and HTML alike)."""
    rows = []
    for p in tl.phases:
        steady = f"{p.steady_from_s:.1f}-{p.steady_to_s:.1f}" if p.steady_from_s is not None else "none"
        rows.append(
            [
                str(p.phase),
                p.label,
                f"{p.start_s:g}-{p.end_s:g}",
                steady,
                _f(p.output_tok_s),
                _f(p.ttft_p50_s, ".0f", 1e3),
                _f(p.tpot_p50_s, ".1f", 1e3),
                _f(p.accept_length, ".2f"),
                _f(p.running),
                _f(p.spec_steps, ".2f"),
                _f(p.power_w, ".0f"),
                _f(p.steps_adapt_s),
                _f(p.tok_s_adapt_s),
                p.excluded,
            ]
        )
    return rows


def phase_table(tl: Timeline) -> Table:
    """One row per phase: its steady-state figures (ramp-up and drain excluded) and the time to adapt."""
    t = Table(
        title=f"Load profile · {tl.point}: steady state per phase (ramp-up and drain excluded) and time to adapt",
        title_justify="left",
        header_style="bold",
    )
    for name in PHASE_HEADERS:
        t.add_column(
            name, justify="left" if name == "Excluded" else "right", min_width=26 if name == "Excluded" else None
        )
    for cells in phase_cells(tl):
        t.add_row(*cells)
    return t


def timeline_html(tl: Timeline, figure: str) -> str:
    """The phase table as HTML, then the point's figure (``figure``: its markup, or empty)."""
    import html

    head = "".join(f"<th>{html.escape(h)}</th>" for h in PHASE_HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in phase_cells(tl))
    title = f"<h3>{html.escape(tl.point)} <small>({tl.window_s:g} s windows)</small></h3>"
    return f'{title}<div class="scroll"><table><tr>{head}</tr>{body}</table></div>{figure}'


def window_table(tl: Timeline) -> Table:
    """One row per window of ``window_s``."""
    t = Table(title=f"Timeline · {tl.point} ({tl.window_s:g} s windows)", title_justify="left", header_style="bold")
    for name in ("From s", "Phase", "Sends", "Output tok/s", "TTFT p50 ms", "TPOT p50 ms", "Accept len"):
        t.add_column(name, justify="right")
    for name in ("Running", "Active steps", "Power W"):
        t.add_column(name, justify="right")
    for w in tl.windows:
        t.add_row(
            f"{w.start_s:g}",
            str(w.phase),
            str(w.sends),
            _f(w.output_tok_s),
            _f(w.ttft_p50_s, ".0f", 1e3),
            _f(w.tpot_p50_s, ".1f", 1e3),
            _f(w.accept_length, ".2f"),
            _f(w.running),
            _f(w.spec_steps, ".2f"),
            _f(w.power_w, ".0f"),
        )
    return t


def render_timelines(timelines: list[Timeline]) -> list[RenderableType]:
    """Both tables of every profiled point, and what their samples lacked."""
    out: list[RenderableType] = []
    for tl in timelines:
        out += [phase_table(tl), window_table(tl)]
        out += [Text(f"! {tl.point}: {n}", style="yellow") for n in tl.notes]
    return out
