"""The columns of the report's per-point sections, declared once: the key of the row they read, their header, the
number format and the unit. The terminal (rig.analysis.render) and the HTML page (rig.analysis.html) build their
tables from these; CSV and JSON carry every key of the rows (rig.analysis.report.export_csv, full_json).

``spec`` is a format for rig.analysis.tables.fmt (None: the value as text; LEVEL: a load level); ``unit`` is said
once where the table shows it (the HTML header, the terminal's title)."""

from __future__ import annotations

from dataclasses import dataclass

LEVEL = "level"  # a load level: a concurrency (int) or a rate (float)


@dataclass(frozen=True)
class Column:
    """One column of a report table."""

    key: str
    header: str
    spec: str | None = None
    unit: str = ""

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
    Column("running_mean", "Running mean", ",.1f"),
    Column("running_max", "Running max", ",.0f"),
    Column("queued_mean", "Queued mean", ",.1f"),
    Column("queued_max", "Queued max", ",.0f"),
    Column("token_usage_mean", "Token usage mean", ".1%"),
    Column("token_usage_max", "Token usage max", ".1%"),
    Column("max_running_requests", "Max running (eff.)"),
    Column("at_running_cap", "At cap, queueing"),
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
