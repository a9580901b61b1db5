"""One self-contained HTML page of a report: tables inline, plots embedded as base64 PNG (no external references)."""

from __future__ import annotations

import base64
import functools
import html
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rig.analysis import columns
from rig.analysis.adaptive import search_rows, tune_rows
from rig.analysis.columns import Column, Readable
from rig.analysis.lossless import mismatch_rows, not_checked_reason
from rig.analysis.plots import write_plots
from rig.analysis.render import seeds_line
from rig.analysis.report import Report
from rig.analysis.settings import grid_knobs
from rig.analysis.tables import adaptive_configs, group_rows, group_title

Col = tuple[str | None, str, Callable[[Any], str]]  # key (None: the function reads the row), header, text

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;padding:0 1.5em;max-width:1500px;
color:#222;line-height:1.4}
h1{font-size:1.5em;margin:.2em 0} h2{font-size:1.25em} h3{font-size:1.05em;margin:.8em 0 .3em}
h3 small{font-weight:normal;color:#555}
.verdict{border:1px solid #ccd;border-radius:6px;padding:.2em 1em 1em;background:#fafbff}
.verdict ul{margin:.2em 0 .6em;padding-left:1.2em} .verdict li{margin:.15em 0}
.wl{display:flex;flex-wrap:wrap;gap:0 2em;align-items:flex-start;border-top:1px solid #e4e6ef;padding-top:.3em}
.wl .txt{flex:1 1 340px} .ci{white-space:nowrap} .wl figure{flex:0 1 560px}
.health p{margin:.2em 0} .health.ok{color:#064} .health.warn{color:#850}
details{border-top:1px solid #ddd;padding:.4em 0} summary{cursor:pointer;font-weight:600;font-size:1.1em;padding:.3em 0}
.scroll,.tw{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
caption{text-align:left;font-weight:600;padding:.2em 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.warn{color:#a60} .bad{color:#b00;font-weight:bold} .ok{color:#070}
pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:12px}
figure{margin:.5em 0} figure svg{display:block;width:100%;height:auto}
figure.fig{max-width:560px} figure.wide{max-width:1100px;min-width:560px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
@media (max-width:600px){body{padding:0 .6em;margin:.6em auto;font-size:15px} .verdict{padding:.1em .6em .6em}
table{font-size:12px} .warn{overflow-wrap:anywhere}}
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
    return f'<div class="tw"><table>{cap}<tr>{head}</tr>{"".join(body)}</table></div>'


def html_cols(declared: list[Column]) -> list[Col]:
    """HTML columns from the report's column declarations (rig.analysis.columns): the unit in the header."""
    return [_html_col(c) for c in declared]


def _html_col(c: Column) -> Col:
    if c.spec is None and c.flag is None and c.yes_no is None and c.missing == "–":  # text as it is (a list joined)
        return c.key, c.titled(), _text
    return None, c.titled(), functools.partial(columns.cell_text, c)  # the terminal's cell, read from the row


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


def _simulated(report: Report) -> bool:
    return any("simulated" in str(r.get("energy_source") or "") for r in report.campaign)


def energy_html(report: Report) -> list[str]:
    """The energy and cost table (where the run has them)."""
    if not (report.energy or report.cost):
        return []
    declared = (
        columns.ENERGY_IDENTITY + (columns.ENERGY if report.energy else []) + (columns.COST if report.cost else [])
    )
    sim = '<p class="bad">SIMULATED: the simulator\'s power model, not a measurement.</p>' if _simulated(report) else ""
    return [sim, table_html(report.campaign, html_cols(declared))]


def adaptive_html(report: Report) -> list[str]:
    """The steps each point's server actually ran (where adaptive or moved) and the schedule by running batch."""
    from rig.analysis import render_adaptive as ra
    from rig.analysis.active_steps import ACCEPT_RATE_NOTE, worth_showing

    parts: list[str] = []
    if worth_showing(report.active_steps):
        parts += [
            f"<h3>{html.escape(ra.ACTIVE_TITLE)}</h3>",
            table_html(ra.steps_lines(report.active_steps), html_cols(ra.ACTIVE_STEPS)),
            f"<h3>{html.escape(ra.TIER_TITLE)}</h3>",
            table_html(ra.tier_lines(report.active_steps), html_cols(ra.TIERS)),
            f"<p>{html.escape(ACCEPT_RATE_NOTE)}</p>",
        ]
    for s in report.engine_schedule:
        parts += [
            f"<h3>Schedule by running batch: {html.escape(s['workload'])} ({html.escape(s['load_mode'])})</h3>",
            table_html(s["bands"], html_cols(ra.BATCH_BANDS)),
            "<pre>" + html.escape("\n".join(ra.config_lines(s))) + "</pre>",
        ]
    return parts


def schedule_html(report: Report) -> list[str]:
    """The speculative schedule by load: bands, crossovers, each setting at its SLO limit."""
    parts: list[str] = []
    sim = _simulated(report)
    for s in report.schedule:
        parts += [
            f"<h3>Speculative schedule by load: {html.escape(str(s['workload']))} "
            f"({html.escape(str(s['load_mode']))}), best by {html.escape(s['objective'])}</h3>",
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
            "<h3>Pareto frontier</h3><p>decode tok/s per request against aggregate tok/s per GPU; no point of "
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
            f"<h3>Best configuration per load level</h3><p>{html.escape(among)}; margin over the runner-up with "
            "its bootstrap 95% interval, and the paired per-request decode-speed ratio best/runner-up.</p>",
            table_html(report.best_per_level, BEST_LEVEL_COLS),
        ]
    if report.best_per_slo:
        parts += [
            f"<h3>Best configuration under {html.escape(report.best_per_slo[0]['slos'])}</h3>",
            table_html(report.best_per_slo, BEST_SLO_COLS),
        ]
    if report.search:
        parts += [
            f"<h3>SLO search ({html.escape(report.search.describe)})</h3>",
            table_html(search_rows(report.search), SEARCH_COLS),
        ]
    if report.tune:
        rec = report.tune.recommendation
        parts += [
            f"<h3>rig tune ({html.escape(report.tune.describe)})</h3>",
            f"<p><b>{html.escape(rec.answer if rec else 'no recommendation')}</b></p>",
            f"<p>{html.escape(rec.evidence if rec else '')}</p>",
            table_html(tune_rows(report.tune), TUNE_COLS, "predicted vs measured, every probe"),
        ]
    return parts


def _figure(path: Path, wide: bool = False) -> str:
    """A plot inline: SVG as markup (vector, its text as text), PNG as a data URI."""
    if path.suffix != ".svg":
        return _img(path)
    svg = path.read_text()
    svg = svg[svg.index("<svg") :]
    # sized by the page (CSS), not by the figure's points: drop the root's width and height, keep its viewBox
    svg = re.sub(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", svg, count=1)
    cls = "fig wide" if wide else "fig"
    return f'<figure class="{cls}" aria-label="{html.escape(path.stem)}">{svg}</figure>'


def _figures(plots: list[Path], prefix: str, wide: bool = True) -> str:
    found = [p for p in plots if p.stem.startswith(prefix)]
    return "".join(f'<div class="scroll">{_figure(p, wide)}</div>' for p in found)


def _keep_ci(line: str) -> str:
    """A verdict line escaped, its interval kept on one line (a phone wraps the rest)."""
    return re.sub(r"\(95% CI ([^)]*)\)", lambda m: f'<span class="ci">{m.group(0)}</span>', html.escape(line))


def verdict_html(report: Report, plots: list[Path]) -> str:
    """The answer first: health, then per workload its bands, crossovers and figure."""
    from rig.analysis.verdict import figure_name, health_text, verdict, workload_lines

    v = verdict(report)
    cls = "ok" if v.health.good else "warn"
    out = ['<section class="verdict"><h2>Verdict</h2>']
    out.append(f'<div class="health {cls}">' + "".join(f"<p>{html.escape(t)}</p>" for t in health_text(v.health)))
    out.append("</div>")
    for w in v.workloads:
        head, lines = workload_lines(w)
        name = figure_name(w.workload, w.load_mode)
        fig = next((p for p in plots if p.stem == name), None)
        out.append(f'<div class="wl"><div class="txt"><h3>{html.escape(w.workload)} <small>{html.escape(head)}</small>')
        out.append("</h3><ul>" + "".join(f"<li>{_keep_ci(line)}</li>" for line in lines) + "</ul></div>")
        out.append((_figure(fig) if fig is not None else "") + "</div>")
    out.append("</section>")
    return "".join(out)


def _details(summary: str, body: list[str], opened: bool = False) -> str:
    return f"<details{' open' if opened else ''}><summary>{html.escape(summary)}</summary>{''.join(body)}</details>"


def campaign_html(report: Report) -> list[str]:
    """The campaign table, one table per (configuration, workload), then what went wrong."""
    from rig.analysis.tables import render_problems

    parts = []
    knobs = grid_knobs(report.run)
    for _, grp in group_rows(report.campaign):
        open_loop = any(r.get("load_mode") not in (None, "closed") for r in grp)
        repeats = len({r.get("repeat") for r in grp}) > 1
        hidden = ({"rate"} if not open_loop else set()) | ({"repeat"} if not repeats else set())
        cols = html_cols([c for c in columns.CAMPAIGN if c.key not in hidden])
        parts.append(table_html(grp, cols, group_title(grp, knobs, adaptive_configs(report.run))))
    problems = render_problems(report.campaign)
    if problems is not None:  # the same text as the terminal's: errors, each flag's figure, top error messages
        parts.append(f"<h3>What went wrong</h3><pre>{html.escape(problems.plain.split(chr(10), 1)[1])}</pre>")
    return parts


def lossless_html(report: Report) -> list[str]:
    ll = report.lossless
    if ll.requests_checked == 0:
        return [f'<p class="warn">Not checked: {html.escape(not_checked_reason(ll))}.</p>']
    if ll.ok:
        return [
            f'<p class="ok">OK: {ll.requests_checked} temperature-0 requests compared across '
            f"{ll.groups_checked} group(s) of points.</p>"
        ]
    return [
        f'<p class="bad">{len(ll.mismatches)} mismatching request(s)</p>',
        table_html(mismatch_rows(ll), LOSSLESS_COLS),
    ]


def page_html(report: Report, plots: list[Path]) -> str:
    """The page: the verdict, then every section grouped and collapsible, each with its plots."""
    run = report.run
    parts = [
        f"<h1>rig report: {html.escape(run.run_id)}</h1>",
        f"<p>status: <b>{html.escape(str(run.status or 'unknown'))}</b> · {len(report.campaign)} point(s)</p>",
        verdict_html(report, plots),
    ]
    parts += [f'<p class="warn">! {html.escape(w)}</p>' for w in report.warnings]
    parts.append(f"<p>Per-request seeds: {html.escape(seeds_line(run.points))}</p>")
    parts += [f'<p class="warn">{html.escape(line)}</p>' for line in report.telemetry]
    parts.append(_details("Campaign table", campaign_html(report), opened=True))
    speed = _figures(plots, "throughput_vs") + _figures(plots, "request_speed_vs")
    decisions = [
        *decision_html(report),
        *schedule_html(report),
        *adaptive_html(report),
        _figures(plots, "frontier_"),
        speed,
    ]
    parts.append(_details("Decisions: frontier, best per level, schedule", decisions))
    latency = ["<p>milliseconds; ITL percentiles are over tokens.</p>", table_html(report.latency, LATENCY_COLS)]
    parts.append(_details("Latency: percentiles and CDFs", [*latency, _figures(plots, "latency_cdf_")]))
    parts.append(
        _details(
            "Acceptance length",
            [
                "<p>Per-request: rig's, Σ completion tokens / Σ verifies (counts each request's prefill token); "
                "Decode-only: Σ (tokens - 1) / Σ verifies, the figure SGLang's bench_serving prints.</p>",
                table_html(report.acceptance, ACCEPT_COLS),
                _figures(plots, "acceptance_vs", wide=False),
            ],
        )
    )
    parts.append(_details("Server vs client", [table_html(report.server, SERVER_COLS), _figures(plots, "server_")]))
    if report.goodput:
        parts.append(_details(f"Goodput ({report.goodput[0]['slos']})", [table_html(report.goodput, GOODPUT_COLS)]))
    if report.energy or report.cost:
        parts.append(_details("Energy and cost per point", [*energy_html(report), _figures(plots, "energy_vs")]))
    if report.timelines:
        from rig.analysis.timeline_render import timeline_html
        from rig.analysis.verdict import safe_name

        shown = [timeline_html(tl, _figures(plots, f"timeline_{safe_name(tl.point)}")) for tl in report.timelines]
        parts.append(_details("Load profile: steady state per phase, time to adapt, timeline", shown))
    parts.append(_details("Greedy losslessness", lossless_html(report), opened=not report.lossless.ok))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>rig report {html.escape(run.run_id)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )


def render_html(report: Report, plots: list[Path] | None = None) -> str:
    """The report as one self-contained HTML document with ``plots`` inline (SVG, or PNG as data URIs); drawn as SVG
    into a temporary directory if None."""
    if plots is not None:
        return page_html(report, plots)
    with tempfile.TemporaryDirectory() as tmp:
        return page_html(report, write_plots(report, Path(tmp), formats=("svg",)))
