"""Terminal tables of a run's SLO search and tune results (read from its manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rig.analysis.tables import fmt


def _pct(x: float | None) -> str:
    return f"{x * 100:+.1f}%" if x is not None else "–"


def _level(v: Any) -> str:
    return "–" if v is None else f"{v:g}"


def search_table(section: dict[str, Any]) -> Table:
    """Per configuration and workload: max passing and min failing value, their margins, the probes it took."""
    t = Table(title=f"SLO search ({section.get('describe', '')}; margin = headroom of the tightest SLO)",
              title_justify="left", header_style="bold")
    for c in ("Config", "Steps", "Workload", "Outcome", "Max passing", "Margin", "Agg tok/s", "Min failing",
              "Margin ", "Probes"):
        t.add_column(c, justify="left" if c in ("Config", "Workload", "Outcome") else "right")
    for r in section.get("results") or []:
        mp, mf = r.get("max_passing") or {}, r.get("min_failing") or {}
        t.add_row(str(r["server_config"]), fmt(r.get("steps"), "d"), str(r["workload"]),
                  r["status"] + (f": {r['error']}" if r.get("error") else ""),
                  _level(mp.get("level")), _pct(mp.get("margin")), fmt(mp.get("aggregate_tok_s")),
                  _level(mf.get("level")), _pct(mf.get("margin")), str(r.get("probes", 0)))
    return t


def print_adaptive(run_dir: Path) -> None:
    """The search and tune sections of a finished adaptive run."""
    from rig.results import read_manifest

    manifest = read_manifest(run_dir)
    out = Console(width=None if Console().is_terminal else 200)
    if manifest.get("search"):
        out.print(search_table(manifest["search"]))
    if manifest.get("tune"):
        from rig.tune.tune_render import tune_tables

        for t in tune_tables(manifest["tune"]):
            out.print(t)
