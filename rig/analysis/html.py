"""One self-contained HTML page of a report: tables inline, plots embedded as base64 PNG (no external references)."""

from __future__ import annotations

import base64
import functools
import html
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rig.analysis import columns
from rig.analysis.adaptive import search_rows, tune_rows
from rig.analysis.columns import Column, Readable
from rig.analysis.lossless import mismatch_rows
from rig.analysis.plots import write_plots
from rig.analysis.render import seeds_line
from rig.analysis.report import Report
from rig.analysis.tables import group_rows, group_title

Col = tuple[str | None, str, Callable[[Any], str]]  # key (None: the function reads the row), header, text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.warn{color:#a60} .bad{color:#b00;font-weight:bold} .ok{color:#070}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
"""


def _text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return "" if v is None else str(v)


def table_html(rows: Sequence[Readable], cols: list[Col], caption: str = "") -> str:
    """An HTML table of ``rows`` with (key, header, formatter) columns."""
    head = "".join(f'<th class="{"l" if f is _text else ""}">{html.escape(h)}</th>' for _, h, f in cols)
    body = []
    for r in rows:
        cells = "".join(
            f'<td class="{"l" if f is _text else ""}">{html.escape(f(r if k is None else r.get(k)))}</td>'
            for k, _, f in cols
        )
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tr>{head}</tr>{''.join(body)}</table>"


def html_cols(declared: list[Column]) -> list[Col]:
    """HTML columns from the report's column declarations (rig.analysis.columns): the unit in the header."""
    return [_html_col(c) for c in declared]


def _html_col(c: Column) -> Col:
    if c.spec is None and c.flag is None and c.yes_no is None and c.missing == "–":  # text as it is (a list joined)
        return c.key, c.titled(), _text
    return None, c.titled(), functools.partial(columns.cell_text, c)  # the terminal's cell, read from the row


CAMPAIGN_COLS = html_cols(columns.CAMPAIGN)
LATENCY_COLS = html_cols(columns.LATENCY)
ACCEPT_COLS = html_cols(columns.ACCEPTANCE)
SERVER_COLS = html_cols(columns.SERVER)
GOODPUT_COLS = html_cols(columns.GOODPUT)
LOSSLESS_COLS = html_cols(columns.LOSSLESS)


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}"></figure>'


FRONTIER_COLS = html_cols(columns.FRONTIER)
BEST_LEVEL_COLS = html_cols(columns.BEST_LEVEL)
BEST_SLO_COLS = html_cols(columns.BEST_SLO)


SEARCH_COLS = html_cols(columns.SEARCH)
TUNE_COLS = html_cols(columns.TUNE)


def energy_html(report: Report) -> list[str]:
    """The energy and cost table (where the run has them) and the speculative schedule by load."""
    parts: list[str] = []
    sim = any("simulated" in str(r.get("energy_source") or "") for r in report.campaign)
    if report.energy or report.cost:
        declared = (
            columns.ENERGY_IDENTITY + (columns.ENERGY if report.energy else []) + (columns.COST if report.cost else [])
        )
        cols = html_cols(declared)
        parts += [
            "<h2>Energy and cost per point</h2>"
            + ('<p class="bad">SIMULATED: the simulator\'s power model, not a measurement.</p>' if sim else ""),
            table_html(report.campaign, cols),
        ]
    for s in report.schedule:
        parts += [
            f"<h2>Speculative schedule by load: {html.escape(str(s['workload']))} "
            f"({html.escape(str(s['load_mode']))}), best by {html.escape(s['objective'])}</h2>",
            table_html(s["bands"], html_cols(columns.schedule_bands(s["objective"]))),
        ]
        cross = (
            "; ".join(
                f"{c['from']} up to {c['from_level']:g}, {c['to']} from {c['to_level']:g}" for c in s["crossovers"]
            )
            or "none"
        )
        limit_cols = html_cols(columns.schedule_limits(bool(report.energy), bool(report.cost)))
        where = "the highest load meeting the SLOs" if report.slos else "its highest valid load (no SLOs given)"
        parts += [
            f"<p>Crossovers: {html.escape(cross)}</p>",
            table_html(
                s["at_slo_limit"], limit_cols, f"each setting at {where}" + (" (energy SIMULATED)" if sim else "")
            ),
        ]
    return parts


def decision_html(report: Report) -> list[str]:
    """Frontier, best per level and per SLO, SLO search and tune sections."""
    from rig.analysis.slo import describe

    parts = []
    if report.frontier:
        parts += [
            "<h2>Pareto frontier</h2><p>decode tok/s per request against aggregate tok/s per GPU; no point of "
            "the run is better on both.</p>",
            table_html(report.frontier, FRONTIER_COLS),
        ]
    if report.best_per_level:
        among = (
            f"among points meeting {describe(report.slos, report.slo_percentile)}"
            if report.slos
            else "among valid points"
        )
        parts += [
            f"<h2>Best configuration per load level</h2><p>{html.escape(among)}; margin over the runner-up with "
            "its bootstrap 95% interval, and the paired per-request decode-speed ratio best/runner-up.</p>",
            table_html(report.best_per_level, BEST_LEVEL_COLS),
        ]
    if report.best_per_slo:
        parts += [
            f"<h2>Best configuration under {html.escape(report.best_per_slo[0]['slos'])}</h2>",
            table_html(report.best_per_slo, BEST_SLO_COLS),
        ]
    if report.search:
        parts += [
            f"<h2>SLO search ({html.escape(report.search.describe)})</h2>",
            table_html(search_rows(report.search), SEARCH_COLS),
        ]
    if report.tune:
        rec = report.tune.recommendation
        parts += [
            f"<h2>rig tune ({html.escape(report.tune.describe)})</h2>",
            f"<p><b>{html.escape(rec.answer if rec else 'no recommendation')}</b></p>",
            f"<p>{html.escape(rec.evidence if rec else '')}</p>",
            table_html(tune_rows(report.tune), TUNE_COLS, "predicted vs measured, every probe"),
        ]
    return parts


def render_html(report: Report, plots: list[Path] | None = None) -> str:
    """The report as one HTML document embedding ``plots`` (drawn into a temporary directory if None)."""
    run = report.run
    parts = [
        f"<h1>rig report: {html.escape(run.run_id)}</h1>",
        f"<p>status: <b>{html.escape(str(run.status or 'unknown'))}</b> · {len(report.campaign)} point(s)</p>",
    ]
    parts += [f'<p class="warn">! {html.escape(w)}</p>' for w in report.warnings]
    parts.append(f"<p>Per-request seeds: {html.escape(seeds_line(run.points))}</p>")
    parts += [f'<p class="warn">{html.escape(line)}</p>' for line in report.telemetry]
    parts.append("<h2>Campaign table</h2>")
    for _, grp in group_rows(report.campaign):
        open_loop = any(r.get("load_mode") not in (None, "closed") for r in grp)
        repeats = len({r.get("repeat") for r in grp}) > 1
        cols = [
            c
            for c in CAMPAIGN_COLS
            if not (c[0] == "rate" and not open_loop) and not (c[0] == "repeat" and not repeats)
        ]
        parts.append(table_html(grp, cols, group_title(grp)))
    from rig.analysis.tables import render_problems

    problems = render_problems(report.campaign)
    if problems is not None:  # the same text as the terminal's: errors, each flag's figure, top error messages
        parts.append(f"<h2>What went wrong</h2><pre>{html.escape(problems.plain.split(chr(10), 1)[1])}</pre>")
    parts += [
        "<h2>Latency</h2><p>milliseconds; ITL percentiles are over tokens.</p>",
        table_html(report.latency, LATENCY_COLS),
    ]
    parts += [
        "<h2>Acceptance length</h2><p>Per-request: rig's, Σ completion tokens / Σ verifies (counts each "
        "request's prefill token); Decode-only: Σ (tokens - 1) / Σ verifies, the figure SGLang's bench_serving "
        "prints.</p>",
        table_html(report.acceptance, ACCEPT_COLS),
    ]
    parts += ["<h2>Server vs client</h2>", table_html(report.server, SERVER_COLS)]
    if report.goodput:
        parts += [
            f"<h2>Goodput ({html.escape(report.goodput[0]['slos'])})</h2>",
            table_html(report.goodput, GOODPUT_COLS),
        ]
    parts += energy_html(report)
    parts += decision_html(report)
    ll = report.lossless
    parts.append("<h2>Greedy losslessness</h2>")
    if ll.ok:
        parts.append(
            f'<p class="ok">OK: {ll.requests_checked} temperature-0 requests compared across '
            f"{ll.groups_checked} group(s) of points.</p>"
        )
    else:
        parts.append(f'<p class="bad">{len(ll.mismatches)} mismatching request(s)</p>')
        parts.append(table_html(mismatch_rows(ll), LOSSLESS_COLS))
    parts.append("<h2>Plots</h2>")
    if plots is None:
        with tempfile.TemporaryDirectory() as tmp:
            parts += [_img(p) for p in write_plots(report, Path(tmp))]
    else:
        parts += [_img(p) for p in plots]
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>rig report {html.escape(run.run_id)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )
