"""The report's seams: a point's campaign row, its SLO verdict, and the probe an SLO search or tune reads back.

Analysis builds them (rig.analysis.points.campaign_row, rig.analysis.slo.evaluate_slos, rig.tune.probe.read_probe);
the report's renderers, the frontier, the schedule, the search and the tuner read them by attribute. They are made
from figures rig computed itself, so they are built without validation (``model_construct``: no coercion, an int
stays an int and the JSON is what it was); ``to_dict`` is their JSON form, keys in declaration order, optional
sections only once set. A row can also be read by column name (``row["aggregate_tok_s"]``, ``row.get(name)``): the
report's column declarations name fields, and older callers read rows so.
"""

from __future__ import annotations

from typing import Any, Self, TypedDict, cast

from pydantic import BaseModel, ConfigDict


class Row(BaseModel):
    """A typed row that reads like the mapping it replaced (read only: write attributes)."""

    model_config = ConfigDict(extra="forbid")

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """The field's value; ``default`` for a name that is no field or an optional section not set."""
        if key not in type(self).model_fields or key not in self.model_fields_set:
            return default
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.model_fields_set

    def keys(self) -> list[str]:
        """The set fields, in declaration order (the JSON object's keys)."""
        return [k for k in type(self).model_fields if k in self.model_fields_set]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: set fields in declaration order, nested rows as dicts."""
        return {k: _plain(getattr(self, k)) for k in self.keys()}

    @classmethod
    def make(cls, **values: Any) -> Self:
        """A row from figures rig computed (no validation, no coercion)."""
        return cast(Self, cls.model_construct(**values))


def _plain(v: Any) -> Any:
    if isinstance(v, Row):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


class ErrorCount(Row):
    """One of a point's most frequent error messages (failed and cancelled requests)."""

    status: str | None
    error: str
    count: int


class CampaignRow(Row):
    """One point of the campaign table (see rig.analysis.metrics for every definition).

    The fields after ``errors`` are sections added when the report computes them: goodput and the SLO verdict (with
    SLOs), the frontier (per-GPU throughput), energy (with GPU telemetry) and cost (with a GPU-hour price)."""

    point: str
    server_config: str | None
    engine: str | None
    steps: int | None
    workload: str | None
    load_mode: str | None
    concurrency: int | None
    rate: float | None
    achieved_rate: float | None
    repeat: int | None
    status: str | None
    requests: int
    aggregate_tok_s: float | None
    per_request_tok_s: float | None
    decode_tok_s: float | None
    tokens: int
    wall_s: float | None
    first_send_ts: float | None
    last_end_ts: float | None
    ok: int
    failed: int
    cancelled: int
    accept_length: float | None
    accept_source: str | None
    flags: list[str]
    flag_reasons: dict[str, str]
    error: str | None
    errors: list[ErrorCount]
    # with SLOs (rig report --slo, or the run's search or tune)
    goodput_fraction: float | None = None
    goodput_req_s: float | None = None
    goodput_tok_s: float | None = None
    slo_meets: bool | None = None
    slo_margin: float | None = None
    slo_note: str | None = None
    # the frontier (rig.analysis.frontier.mark_frontier)
    tok_s_per_gpu: float | None = None
    on_frontier: bool | None = None
    # energy, with GPU telemetry (rig.analysis.energy.ENERGY_KEYS)
    energy_source: str | None = None
    energy_method: str | None = None
    gpus: int | None = None
    energy_j: float | None = None
    mean_power_w: float | None = None
    j_per_token: float | None = None
    tok_s_per_w: float | None = None
    # cost, with a GPU-hour price
    gpu_hour_price: float | None = None
    usd_per_mtok: float | None = None

    @property
    def level(self) -> float | None:
        """The load level: the rate in an open loop, else the concurrency."""
        return self.rate if self.load_mode not in (None, "closed") else self.concurrency


class SloCheck(Row):
    """One SLO at one point: its percentile value against the limit."""

    slo: str
    metric: str
    limit_s: float
    value_s: float | None
    margin: float | None  # (limit - value) / limit; -1 when the value is a failure's; None iff there is no value
    meets: bool


class SloVerdict(Row):
    """Whether one point's requests meet every SLO at a percentile (rig.analysis.slo.evaluate_slos)."""

    meets: bool
    margin: float | None  # the smallest SLO margin, None unless every SLO has one
    percentile: float
    requests: int
    per_slo: list[SloCheck]
    cancelled: int
    cancelled_counted: str  # excluded | lower-bound
    note: str


# What a search keeps of a probe in the manifest (its bounds: max_passing, min_failing).
PROBE_SUMMARY_FIELDS = ("point", "level", "margin", "per_slo", "aggregate_tok_s", "decode_tok_s", "flags")


class ProbeSummary(TypedDict):
    """A bound's probe as the manifest keeps it (PROBE_SUMMARY_FIELDS, JSON: each SLO check a plain dict)."""

    point: str
    level: float | None
    margin: float | None
    per_slo: list[dict[str, Any]]
    aggregate_tok_s: float | None
    decode_tok_s: float | None
    flags: list[str]


class Probe(Row):
    """One measured point read back by an SLO search or tune: its verdict and the figures they report."""

    point: str
    steps: int | None
    level: float | None
    meets: bool
    margin: float | None
    per_slo: list[SloCheck]
    requests: int
    aggregate_tok_s: float | None
    decode_tok_s: float | None
    accept_length: float | None
    flags: list[str]
    valid: bool  # no invalidating flag
    mean_ttft_s: float | None

    def summary(self) -> ProbeSummary:
        """The fields a search records for a bound, as JSON."""
        return ProbeSummary(
            point=self.point,
            level=self.level,
            margin=self.margin,
            per_slo=_plain(self.per_slo),
            aggregate_tok_s=self.aggregate_tok_s,
            decode_tok_s=self.decode_tok_s,
            flags=list(self.flags),
        )


class GoodputRow(Row):
    """Requests meeting every SLO at one point: count, fraction of ok+failed+cancelled once sent, rate and token rate
    over its wall time (rig.analysis.metrics.goodput; the report adds the point's identity)."""

    slos: str
    good: int
    counted: int
    fraction: float | None
    goodput_req_s: float | None
    goodput_tok_s: float | None
    point: str | None = None
    steps: int | None = None
    workload: str | None = None
    level: float | None = None


class ServerRow(Row):
    """The server's time series at one point summarised (rig.analysis.server_series.summarize_point), next to the
    client's throughput (added by the report)."""

    point: str
    samples: int
    running_mean: float | None
    running_max: float | None
    queued_mean: float | None
    queued_max: float | None
    token_usage_mean: float | None
    token_usage_max: float | None
    gen_throughput_mean: float | None
    accept_length_gauge_mean: float | None
    max_running_requests: Any  # as the server reported it (an int, when it says)
    max_total_num_tokens: Any
    at_running_cap: bool = False  # the running batch pinned at the cap while requests queue
    steps: int | None = None
    workload: str | None = None
    level: float | None = None
    aggregate_tok_s: float | None = None
    per_request_tok_s: float | None = None
    decode_tok_s: float | None = None


class GateVerdict(Row):
    """One regression threshold judged on one pair of points (rig.analysis.gate.judge)."""

    metric: str
    threshold: float
    pairs: int
    regression: float | None
    ci_low: float | None
    ci_high: float | None
    subsampled: bool | None = None  # the interval came from the m-out-of-n bootstrap (not part of the JSON row)
    verdict: str
    why: str


class LosslessResult(Row):
    """Greedy losslessness over a run (rig.analysis.lossless.check_lossless): every temperature-0 request whose
    output differs between points that ran the same requests with different speculative settings."""

    groups_checked: int
    requests_checked: int
    mismatches: list[dict[str, Any]]  # request_id, workload, level, repeat, points, steps, hashes per setting
    ok: bool
