"""The columns of the report's per-point sections, declared once: the key of the row they read, their header, the
number format and the unit. The terminal (rig.analysis.render) and the HTML page (rig.analysis.html) build their
tables from these; CSV and JSON carry every key of the rows (rig.analysis.report.export_csv, full_json).

``spec`` is a format for rig.analysis.tables.fmt (None: the value as text; LEVEL: a load level); ``unit`` is said
once where the table shows it (the HTML header, the terminal's title)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

LEVEL = "level"  # a load level: a concurrency (int) or a rate (float)
COUNT = "count"  # an int with thousands separators; any other number with one decimal
PCT = "+.1%"  # a signed share: a margin


@dataclass(frozen=True)
class Column:
    """One column of a report table."""

    key: str
    header: str
    spec: str | None = None
    unit: str = ""
    pair: str | None = None  # a second figure in the same cell, "first / second" (e.g. mean / max)
    pair_spec: str | None = None
    sep: str = " / "  # between the two figures of a pair
    whole: bool = False  # a pair shown only whole: "–" when its first figure is missing (an interval)
    flag: str | None = None  # a boolean shown as this text when true, else nothing
    scale: float = 1.0  # the row's value times this (J -> kJ: 1e-3)
    missing: str = "–"  # the text of a missing value
    note: str | None = None  # the key of a note shown after the value, in parentheses, when it holds ``note_when``
    note_when: str = ""
    yes_no: tuple[str, str] | None = None  # a boolean as one of two texts (missing: ``missing``)

    @property
    def text(self) -> bool:
        return self.spec is None or self.spec == LEVEL

    def titled(self) -> str:
        """The header with its unit: 'p99 (ms)'."""
        return f"{self.header} ({self.unit})" if self.unit else self.header


CAMPAIGN = [
    Column("concurrency", "Concurrency", "d"),
    Column("rate", "Rate (req/s)", ",.2f"),
    Column("repeat", "Repeat", "d"),
    Column("aggregate_tok_s", "Aggregate tok/s", ",.1f"),
    Column("per_request_tok_s", "Per-request tok/s", ",.1f"),
    Column("decode_tok_s", "Decode tok/s", ",.1f"),
    Column("tokens", "Tokens", ",d"),
    Column("wall_s", "Wall time (s)", ",.1f"),
    Column("ok", "OK", "d"),
    Column("failed", "Failed", "d"),
    Column("accept_length", "Accept len", ".2f"),
    Column("flags", "Flags"),
]
LATENCY = [
    Column("point", "Point"),
    Column("metric", "Metric"),
    Column("n", "n", ",d"),
    *(Column(f"{k}_ms", k, ",.2f", "ms") for k in ("mean", "p50", "p90", "p95", "p99")),
]
ACCEPTANCE = [
    Column("point", "Point"),
    Column("steps", "Steps", "d"),
    Column("level", "Level", LEVEL),
    Column("accept_length", "Accept len", ".3f"),
    Column("source", "Source"),
    Column("from_requests", "Per-request", ".3f"),
    Column("decode_only", "Decode-only", ".3f"),
    Column("from_manifest_window", "Manifest window", ".3f"),
    Column("from_server_counters", "Counters", ".3f"),
    Column("server_gauge_mean", "Gauge mean", ".3f"),
]
SERVER = [
    Column("point", "Point"),
    Column("steps", "Steps", "d"),
    Column("level", "Level", LEVEL),
    Column("aggregate_tok_s", "Agg tok/s", ",.1f"),
    Column("decode_tok_s", "Decode tok/s", ",.1f"),
    Column("running_mean", "Running mean/max", ",.1f", pair="running_max", pair_spec=",.0f"),
    Column("queued_mean", "Queued mean/max", ",.1f", pair="queued_max", pair_spec=",.0f"),
    Column("token_usage_mean", "Token usage mean/max", ".1%", pair="token_usage_max", pair_spec=".1%"),
    Column("max_running_requests", "Max running (eff.)", COUNT),
    Column("samples", "Samples", ",d"),
    Column("at_running_cap", "Note", flag="at running cap, queueing"),
]
GOODPUT = [
    Column("point", "Point"),
    Column("steps", "Steps", "d"),
    Column("level", "Level", LEVEL),
    Column("good", "Good", ",d"),
    Column("counted", "Counted", ",d"),
    Column("fraction", "Fraction", ".1%"),
    Column("goodput_req_s", "Goodput req/s", ",.2f"),
    Column("goodput_tok_s", "Goodput tok/s", ",.1f"),
]
LOSSLESS = [
    Column("request_id", "Request"),
    Column("workload", "Workload"),
    Column("concurrency", "Concurrency"),
    Column("rate", "Rate"),
    Column("repeat", "Repeat"),
    Column("steps", "Steps"),
    Column("hashes", "Output hashes"),
]

FRONTIER = [
    Column("workload", "Workload"),
    Column("point", "Point"),
    Column("steps", "Steps", "d"),
    Column("level", "Level", LEVEL),
    Column("tok_s_per_gpu", "Tok/s per GPU", ",.1f"),
    Column("decode_tok_s", "Decode tok/s", ",.1f"),
    Column("aggregate_tok_s", "Agg tok/s", ",.1f"),
]
BEST_LEVEL = [
    Column("workload", "Workload"),
    Column("level", "Level", LEVEL),
    Column("best", "Best"),
    Column("best_aggregate_tok_s", "Agg tok/s", ",.1f"),
    Column("runner_up", "Runner-up"),
    Column("margin", "Margin", PCT),
    Column("ci_low", "95% CI", PCT, pair="ci_high", sep=" … ", whole=True),
    Column("paired_decode_speedup", "Paired decode", ".3f"),
    Column("paired_ci_low", "95% CI ", ".3f", pair="paired_ci_high", sep="–", whole=True),
]
BEST_SLO = [
    Column("workload", "Workload"),
    Column("best", "Best", missing="none meets"),
    Column("max_passing", "Max passing", LEVEL, note="max_passing_note", note_when="cancelled request"),
    Column("min_failing", "Min failing", LEVEL),
    Column("best_aggregate_tok_s", "Agg tok/s", ",.1f"),
    Column("runner_up", "Runner-up"),
    Column("runner_up_max_passing", "Its max passing", LEVEL),
    Column("capacity_margin", "Capacity margin", PCT),
    Column("throughput_margin", "Tok/s margin", PCT),
    Column("ci_low", "95% CI", PCT, pair="ci_high", sep=" … ", whole=True),
]
SEARCH = [
    Column("server_config", "Config"),
    Column("steps", "Steps", "d"),
    Column("workload", "Workload"),
    Column("outcome", "Outcome"),
    Column("max_passing", "Max passing", LEVEL),
    Column("mp_margin", "Margin", PCT),
    Column("mp_aggregate_tok_s", "Agg tok/s", ",.1f"),
    Column("min_failing", "Min failing", LEVEL),
    Column("mf_margin", "Margin ", PCT),
    Column("probes", "Probes", "d"),
]
TUNE = [
    Column("n", "#", "d"),
    Column("round", "Round", "d"),
    Column("point", "Point"),
    Column("steps", "Steps", "d"),
    Column("level", "Level", LEVEL),
    Column("why", "Why", missing=""),
    Column("predicted_margin", "Pred. margin", PCT),
    Column("margin", "Meas. margin", PCT),
    Column("predicted_aggregate_tok_s", "Pred. agg tok/s", ",.1f"),
    Column("aggregate_tok_s", "Meas. agg tok/s", ",.1f"),
    Column("verdict", "Verdict"),
]
OBJECTIVE_TEXT = {"throughput": "aggregate tok/s", "j_per_token": "J/token", "usd_per_mtok": "$/Mtok"}


def schedule_bands(objective: str) -> list[Column]:
    """The speculative schedule's bands, best by ``objective`` (rig.analysis.schedule)."""
    name = OBJECTIVE_TEXT.get(objective, objective).capitalize()
    spec = ",.1f" if objective == "throughput" else ",.3f"
    return [
        Column("level", "Band from", LEVEL),
        Column("up_to", "up to", LEVEL),
        Column("best", "Best", missing="none meets"),
        Column("value", name, spec),
        Column("runner_up", "Runner-up"),
        Column("runner_up_value", name + " ", spec),
        Column("margin", "Margin", PCT),
        Column("ci_low", "95% CI", PCT, pair="ci_high", sep=" … ", whole=True),
        Column("decided", "Decided", yes_no=("yes", "no (CI spans 0)")),
    ]


def schedule_limits(energy: bool, cost: bool) -> list[Column]:
    """Each setting at its SLO limit (its highest valid load without SLOs), with energy and cost where known."""
    out = [
        Column("config", "Setting"),
        Column("max_level", "Max level", LEVEL),
        Column("aggregate_tok_s", "Agg tok/s", ",.1f"),
        Column("tok_s_per_gpu", "Tok/s per GPU", ",.1f"),
    ]
    if energy:
        out += [
            Column("mean_power_w", "Mean power", ",.0f", "W"),
            Column("j_per_token", "J/token", ",.3f"),
            Column("tok_s_per_w", "Tok/s per W", ",.3f"),
        ]
    return out + (COST if cost else [])


# Energy and cost per point (rig.analysis.energy): the identity, then the energy columns where the run has GPU
# telemetry, then the cost where a GPU-hour price was given.
ENERGY_IDENTITY = [
    Column("point", "Point"),
    Column("steps", "Steps", "d"),
    Column("level", "Level", LEVEL),
    Column("aggregate_tok_s", "Agg tok/s", ",.1f"),
]
ENERGY = [
    Column("energy_source", "Source"),
    Column("energy_method", "Method"),
    Column("gpus", "GPUs", "d"),
    Column("energy_j", "Energy", ",.2f", "kJ", scale=1e-3),
    Column("mean_power_w", "Mean power", ",.0f", "W"),
    Column("j_per_token", "J/token", ",.3f"),
    Column("tok_s_per_gpu", "Tok/s per GPU", ",.1f"),
    Column("tok_s_per_w", "Tok/s per W", ",.3f"),
]
COST = [Column("usd_per_mtok", "$/Mtok", ",.3f")]


class ByName(Protocol):
    """A typed row (rig.contracts.report.Row, rig.analysis.adaptive.TuneRow), read by column name."""

    def get(self, key: str, default: Any = None) -> Any: ...


# A report row: a mapping (a dict, or a TypedDict of rig.analysis.rows) or a typed row, read by column name.
Readable: TypeAlias = Mapping[str, Any] | ByName


def fmt(x: Any, spec: str = ",.1f") -> str:
    """A number for a table cell; '–' for missing."""
    if x is None:
        return "–"
    if isinstance(x, float) and x != x:
        return "–"
    return format(x, spec)


def level_text(row: Readable) -> str:
    """A row's load level: its ``level`` (a typed campaign row derives it from its rate or concurrency)."""
    lv = row.get("level") if isinstance(row, dict) else getattr(row, "level", None)
    if lv is None and isinstance(row, dict) and "load_mode" in row:  # a plain campaign-shaped row
        lv = row.get("rate") if row.get("load_mode") not in (None, "closed") else row.get("concurrency")
    return "–" if lv is None else (f"{lv:g}" if isinstance(lv, float) else str(lv))


def cell_text(c: Column, row: Readable) -> str:
    """The text of one declared column's cell in ``row``, the same in the terminal and the HTML page."""
    v = row.get(c.key)
    if c.flag is not None:
        return c.flag if v else ""
    if c.yes_no is not None:
        return c.missing if v is None else c.yes_no[0 if v else 1]
    if c.spec == LEVEL:
        text = level_text(row) if c.key == "level" else ("–" if v is None else f"{v:g}")
        note = str(row.get(c.note) or "") if c.note else ""
        return text + (f" ({note})" if note and c.note_when in note else "")
    if c.spec is None:
        return c.missing if v is None else str(v)
    if c.spec == COUNT:
        return fmt(v, ",d") if isinstance(v, int) else fmt(v)
    if c.scale != 1.0 and isinstance(v, int | float):
        v = v * c.scale
    if c.pair is None:
        return fmt(v, c.spec)
    if c.whole and v is None:
        return "–"
    return f"{fmt(v, c.spec)}{c.sep}{fmt(row.get(c.pair), c.pair_spec or c.spec)}"
