"""Terminal tables of a run's decisions: frontier, best per level and per SLO, SLO search and tune results."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rig.analysis import columns, declared
from rig.analysis.rows import FrontierRow, ReportLevelBest, SearchRow
from rig.contracts import SearchSection, TuneProbe, TuneSection


def search_rows(section: SearchSection) -> list[SearchRow]:
    """One flat row per configuration and workload searched: its bounds, their margins, the probes it took."""
    out = []
    for r in section.results:
        mp, mf = r.max_passing or {}, r.min_failing or {}
        out.append(
            SearchRow(
                server_config=str(r.server_config),
                steps=r.steps,
                workload=str(r.workload),
                status=r.status,
                outcome=r.status + (f": {r.error}" if r.error else ""),
                max_passing=mp.get("level"),
                mp_margin=mp.get("margin"),
                mp_aggregate_tok_s=mp.get("aggregate_tok_s"),
                min_failing=mf.get("level"),
                mf_margin=mf.get("margin"),
                probes=r.probes,
            )
        )
    return out


def search_table(section: SearchSection) -> Table:
    """Per configuration and workload: max passing and min failing value, their margins, the probes it took."""
    t = Table(
        title=f"SLO search ({section.describe}; margin = headroom of the tightest SLO)",
        title_justify="left",
        header_style="bold",
    )
    return declared.fill(t, columns.SEARCH, search_rows(section))


@dataclass(frozen=True)
class TuneRow:
    """One probe of a tune as its table shows it: its number, the probe, the verdict (read by column name)."""

    n: int
    probe: TuneProbe
    verdict: str

    def get(self, key: str, default: Any = None) -> Any:
        if key in ("n", "verdict"):
            return getattr(self, key)
        return getattr(self.probe, key, default)


def tune_rows(section: TuneSection) -> list[TuneRow]:
    """Every probe of a tune, numbered, with its prediction, its measurement and the verdict."""
    out = []
    for i, p in enumerate(section.probes, 1):
        verdict = "–" if p.meets is None else ("meets" if p.meets else "misses")
        if p.meets is not None and p.predicted_meets is not None and p.meets != p.predicted_meets:
            verdict += " (mispredicted)"
        out.append(TuneRow(i, p, verdict))
    return out


def frontier_table(rows: list[FrontierRow]) -> Table:
    """The Pareto points: per-user decode speed against per-GPU throughput."""
    t = Table(
        title="Pareto frontier (decode tok/s per request vs aggregate tok/s per GPU; no point beats these on both)",
        title_justify="left",
        header_style="bold",
    )
    return declared.fill(t, columns.FRONTIER, rows)


def best_level_table(rows: list[ReportLevelBest], slo_text: str | None) -> Table:
    """Best configuration per load level, margin with CI, and the paired per-request decode-speed ratio."""
    among = f"among points meeting {slo_text}" if slo_text else "among valid points"
    t = Table(
        title=f"Best configuration per load level ({among}; aggregate tok/s margin over the runner-up, 95% CI; "
        "paired decode-speed ratio best/runner-up)",
        title_justify="left",
        header_style="bold",
    )
    return declared.fill(t, columns.BEST_LEVEL, rows)


def best_slo_table(rows: list[dict[str, Any]]) -> Table:
    """Per workload: the configuration that meets the SLOs at the highest load."""
    slos = rows[0]["slos"] if rows else ""
    t = Table(
        title=f"Best configuration under {slos} (highest load meeting every SLO; ties: higher aggregate tok/s)",
        title_justify="left",
        header_style="bold",
    )
    return declared.fill(t, columns.BEST_SLO, rows)


def tune_tables(section: TuneSection) -> list[Table]:
    """Predicted vs measured for every probe, then the recommendation with its evidence."""
    t = Table(
        title=f"rig tune: predicted vs measured ({section.describe})",
        title_justify="left",
        header_style="bold",
    )
    declared.fill(t, columns.TUNE, tune_rows(section))
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
    """The search, tune and prove sections of a finished adaptive run."""
    from rig.results import load_manifest

    manifest = load_manifest(run_dir)
    out = Console(width=None if Console().is_terminal else 200)
    if manifest.search:
        out.print(search_table(manifest.search))
    if manifest.tune:
        for t in tune_tables(manifest.tune):
            out.print(t)
    if manifest.prove:
        from rig.analysis.prove import prove_table

        out.print(prove_table(manifest.prove))
