"""Terminal tables of a run's decisions: frontier, best per level and per SLO, SLO search and tune results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rig.analysis import columns
from rig.analysis.tables import fmt
from rig.contracts import SearchSection, TuneSection


def _pct(x: float | None) -> str:
    return f"{x * 100:+.1f}%" if x is not None else "–"


def _level(v: Any) -> str:
    return "–" if v is None else f"{v:g}"


def search_table(section: SearchSection) -> Table:
    """Per configuration and workload: max passing and min failing value, their margins, the probes it took."""
    t = Table(
        title=f"SLO search ({section.describe}; margin = headroom of the tightest SLO)",
        title_justify="left",
        header_style="bold",
    )
    for c in (
        "Config",
        "Steps",
        "Workload",
        "Outcome",
        "Max passing",
        "Margin",
        "Agg tok/s",
        "Min failing",
        "Margin ",
        "Probes",
    ):
        t.add_column(c, justify="left" if c in ("Config", "Workload", "Outcome") else "right")
    for r in section.results:
        mp, mf = r.max_passing or {}, r.min_failing or {}
        t.add_row(
            str(r.server_config),
            fmt(r.steps, "d"),
            str(r.workload),
            r.status + (f": {r.error}" if r.error else ""),
            _level(mp.get("level")),
            _pct(mp.get("margin")),
            fmt(mp.get("aggregate_tok_s")),
            _level(mf.get("level")),
            _pct(mf.get("margin")),
            str(r.probes),
        )
    return t


def _declared(t: Table, declared: list[columns.Column], rows: list[dict[str, Any]]) -> Table:
    """Fill ``t`` from a column declaration (rig.analysis.columns), the one the HTML page reads too."""
    for c in declared:
        t.add_column(c.titled(), justify="left" if c.spec is None else "right")
    for r in rows:
        t.add_row(*(columns.cell_text(c, r) for c in declared))
    return t


def frontier_table(rows: list[dict[str, Any]]) -> Table:
    """The Pareto points: per-user decode speed against per-GPU throughput."""
    t = Table(
        title="Pareto frontier (decode tok/s per request vs aggregate tok/s per GPU; no point beats these on both)",
        title_justify="left",
        header_style="bold",
    )
    return _declared(t, columns.FRONTIER, rows)


def best_level_table(rows: list[dict[str, Any]], slo_text: str | None) -> Table:
    """Best configuration per load level, margin with CI, and the paired per-request decode-speed ratio."""
    among = f"among points meeting {slo_text}" if slo_text else "among valid points"
    t = Table(
        title=f"Best configuration per load level ({among}; aggregate tok/s margin over the runner-up, 95% CI; "
        "paired decode-speed ratio best/runner-up)",
        title_justify="left",
        header_style="bold",
    )
    return _declared(t, columns.BEST_LEVEL, rows)


def best_slo_table(rows: list[dict[str, Any]]) -> Table:
    """Per workload: the configuration that meets the SLOs at the highest load."""
    slos = rows[0]["slos"] if rows else ""
    t = Table(
        title=f"Best configuration under {slos} (highest load meeting every SLO; ties: higher aggregate tok/s)",
        title_justify="left",
        header_style="bold",
    )
    return _declared(t, columns.BEST_SLO, rows)


def tune_tables(section: TuneSection) -> list[Table]:
    """Predicted vs measured for every probe, then the recommendation with its evidence."""
    t = Table(
        title=f"rig tune: predicted vs measured ({section.describe})",
        title_justify="left",
        header_style="bold",
    )
    for c in (
        "#",
        "Round",
        "Point",
        "Steps",
        "Level",
        "Why",
        "Pred. margin",
        "Meas. margin",
        "Pred. agg tok/s",
        "Meas. agg tok/s",
        "Verdict",
    ):
        t.add_column(c, justify="left" if c in ("Point", "Why", "Verdict") else "right")
    for i, p in enumerate(section.probes, 1):
        verdict = "–" if p.meets is None else ("meets" if p.meets else "misses")
        if p.meets is not None and p.predicted_meets is not None and p.meets != p.predicted_meets:
            verdict += " (mispredicted)"
        t.add_row(
            str(i),
            str(p.round),
            p.point,
            fmt(p.steps, "d"),
            _level(p.level),
            p.why or "",
            _pct(p.predicted_margin),
            _pct(p.margin),
            fmt(p.predicted_aggregate_tok_s),
            fmt(p.aggregate_tok_s),
            verdict,
        )
    out = [t]
    rec = section.recommendation.model_dump() if section.recommendation else {}
    r = Table(title="rig tune: recommendation", title_justify="left", header_style="bold", show_header=False)
    r.add_column("", justify="left")
    r.add_column("", justify="left")
    for k, label in (
        ("answer", "Answer"),
        ("evidence", "Evidence"),
        ("stable", "Stable"),
        ("measured_points", "Measured points"),
        ("grid_points", "Grid would measure"),
        ("stop_reason", "Stopped because"),
    ):
        if rec.get(k) is not None:
            r.add_row(label, str(rec[k]))
    out.append(r)
    return out


def print_adaptive(run_dir: Path) -> None:
    """The search and tune sections of a finished adaptive run."""
    from rig.results import load_manifest

    manifest = load_manifest(run_dir)
    out = Console(width=None if Console().is_terminal else 200)
    if manifest.search:
        out.print(search_table(manifest.search))
    if manifest.tune:
        for t in tune_tables(manifest.tune):
            out.print(t)
