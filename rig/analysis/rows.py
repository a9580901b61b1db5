"""The rows of `rig compare` and of the report's decision tables, typed: each stays the JSON object it was (a
TypedDict is a dict at run time, keys in the order they are written), so JSON, CSV and the golden outputs keep their
bytes, while mypy checks every key a builder writes and a reader reads.

Rows read by column name (rig.analysis.columns.Readable) go to the terminal and HTML tables as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:
    from rig.contracts import CampaignRow, GoodputRow


class PairIdentity(TypedDict):
    """Which two points a comparison row pairs (the load level is the candidate's; rig.analysis.pairing)."""

    baseline: str
    candidate: str
    baseline_point: str
    candidate_point: str
    workload: str | None
    load_mode: str | None
    concurrency: int | None
    rate: float | None
    repeat: int | None
    baseline_steps: int | None
    candidate_steps: int | None


class SpeedupRow(PairIdentity):
    """One metric of one pair: geometric-mean speedup over the paired requests, its CI, the median ratio."""

    metric: str
    pairs: int
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    median_ratio: float | None
    incomplete: str | None


class EnergyRatioRow(PairIdentity):
    """J/token or $/Mtok of the candidate over the baseline, with its paired interval (rig.analysis.energy_compare)."""

    metric: str
    baseline_value: float
    candidate_value: float
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    pairs: int
    source: str | None
    incomplete: str | None


class GateRow(TypedDict):
    """One check of the gate: a regression threshold judged on one pair of points (rig.contracts.GateVerdict
    without ``subsampled``), or what the thresholds cannot see (rig.analysis.gate_inputs: no pair, no threshold)."""

    baseline: str | None
    candidate: str | None
    metric: str
    threshold: float | None
    pairs: int | None
    regression: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str
    why: str
    incomplete: str | None
    failed: NotRequired[int]  # the served check: requests the candidate failed


class LevelBest(TypedDict):
    """The best configuration at one (workload, load level) and its margin over the runner-up (rig compare)."""

    workload: str | None
    load_mode: str | None
    concurrency: int | None
    rate: float | None
    best: str
    best_aggregate_tok_s: float
    runner_up: str | None
    runner_up_aggregate_tok_s: float | None
    margin: float | None
    ci_low: float | None
    ci_high: float | None
    ci_method: str | None
    incomplete: str | None


class ReportLevelBest(LevelBest):
    """The report's best per load level: compare's row, the level, the best point and the paired decode ratio."""

    level: float | int | None
    best_point: str | None
    paired_decode_speedup: float | None
    paired_ci_low: float | None
    paired_ci_high: float | None
    pairs: int


class CompareResult(TypedDict):
    """What `rig compare` computes (its --json)."""

    mode: str
    resamples: int
    seed: int
    speedups: list[SpeedupRow]
    best: list[LevelBest]
    warnings: list[str]
    energy: NotRequired[list[EnergyRatioRow]]  # only where a side has GPU telemetry or a price
    gate: NotRequired[list[GateRow]]  # only with --max-regression


class FrontierRow(TypedDict):
    """A point on the Pareto frontier of per-GPU throughput against per-request decode speed."""

    workload: str | None
    point: str
    steps: int | None
    server_config: str | None
    load_mode: str | None
    concurrency: int | None
    rate: float | None
    tok_s_per_gpu: float | None
    decode_tok_s: float | None
    aggregate_tok_s: float | None


class MismatchRow(TypedDict):
    """One greedy request whose output differs between speculative settings, flat for tables and CSV."""

    request_id: Any
    workload: Any
    concurrency: Any
    rate: Any
    repeat: Any
    steps: str
    hashes: str


class LatencyRow(TypedDict):
    """One latency metric of one point: n, mean and percentiles in milliseconds (rig.analysis.percentiles)."""

    point: str
    metric: str
    n: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


class SearchRow(TypedDict):
    """One configuration and workload of an SLO search: its bounds, their margins, the probes it took."""

    server_config: str
    steps: int | None
    workload: str
    status: str
    outcome: str
    max_passing: Any
    mp_margin: Any
    mp_aggregate_tok_s: Any
    min_failing: Any
    mf_margin: Any
    probes: int


class FullReport(TypedDict):
    """Every decision-level section of a report (`rig report --json-full`), in its order."""

    run_id: str
    status: str | None
    warnings: list[str]
    slos: list[str]
    slo_percentile: float | None
    campaign: list[CampaignRow]
    frontier: list[FrontierRow]
    best_per_level: list[ReportLevelBest]
    best_per_slo: list[dict[str, Any]]
    goodput: list[GoodputRow]
    search: dict[str, Any] | None  # the manifest's sections as JSON
    tune: dict[str, Any] | None
    objective: str
    schedule: list[ScheduleGroup]
    engine_schedule: list[EngineSchedule]
    telemetry: NotRequired[list[str]]  # only where the run has GPU figures or says why not
    prove: NotRequired[dict[str, Any]]  # only in a rig prove run: the manifest's section (bands or phases, verdict)
    timeline: NotRequired[list[dict[str, Any]]]  # only where points ran a load profile (rig.analysis.timeline)
    active_steps: NotRequired[list[ActiveStepsRow]]  # only where a point is adaptive or its steps moved


class AcceptanceRow(TypedDict):
    """A point's acceptance length from every source side by side (the report's acceptance table)."""

    point: str
    steps: int | None
    workload: str | None
    level: float | None
    accept_length: float | None
    source: str | None
    from_requests: float | None
    decode_only: float | None
    from_manifest_window: float | None
    from_server_counters: float | None
    server_gauge_mean: float | None


class ScheduleBand(TypedDict):
    """One load band of the schedule: the best configuration from ``level`` up to ``up_to``, its runner-up and the
    margin's 95 % interval (rig.analysis.schedule)."""

    level: float
    up_to: float | None
    best: str | None
    best_steps: Any
    value: float | None
    runner_up: str | None
    runner_up_value: float | None
    margin: float | None
    ci_low: float | None
    ci_high: float | None
    ci_method: str | None
    decided: bool | None
    candidates: int
    missing: list[str]  # settings with no valid point at this level: the band's answer does not rank them


# Where the best configuration changes between consecutive answered bands ("from" is a keyword: functional form).
Crossover = TypedDict(
    "Crossover",
    {
        "from_level": float,
        "to_level": float,
        "from": str,
        "to": str,
        "from_steps": Any,
        "to_steps": Any,
        "incomplete": list[str] | None,
        "decided": bool,
    },
)


class LimitEntry(TypedDict):
    """One configuration at the highest level where it meets the SLOs, with its figures there."""

    config: str
    steps: Any
    max_level: float | None
    points: list[str]
    aggregate_tok_s: float | None
    tok_s_per_gpu: float | None
    mean_power_w: float | None
    j_per_token: float | None
    tok_s_per_w: float | None
    usd_per_mtok: float | None
    energy_source: str | None


class ScheduleGroup(TypedDict):
    """The schedule of one (workload, load mode): its bands, crossovers and each setting at its SLO limit."""

    workload: str
    load_mode: str
    objective: str
    key: str
    higher_is_better: bool
    bands: list[ScheduleBand]
    crossovers: list[Crossover]
    at_slo_limit: list[LimitEntry]


class TierRow(TypedDict):
    """One active tier of one point: its time, the scrape windows wholly in it, and what they measured."""

    tier: int
    seconds: float
    share: float
    windows: int
    accept_length: float | None
    gen_tok_s: float | None


class ActiveStepsRow(TypedDict):
    """The steps a point's server ran, over time (from the spec_num_steps gauge)."""

    point: str
    startup_steps: int | None
    adaptive: str | None  # the candidate table (rig.contracts.adaptive.AdaptiveTable.describe), None: fixed steps
    samples: int
    span_s: float
    mean: float | None
    min: int | None
    max: int | None
    switches: int
    mixed_windows: int
    tiers: list[TierRow]


class VllmSpeculativeConfig(TypedDict):
    """vLLM's --speculative-config with a batch-size schedule."""

    method: str
    num_speculative_tokens: int
    num_speculative_tokens_per_batch_size: list[list[int]]
    model: NotRequired[str]  # the draft (draft_model, eagle, eagle3): vLLM loads it from here


class SglangSlot(TypedDict):
    """One batch-size slot of an SGLang adaptive config."""

    candidate_steps: list[int]


SglangAdaptiveConfig = dict[str, SglangSlot]  # slot key (a batch size, digits) -> its candidates


class BatchBand(TypedDict):
    """One band of the schedule with the running batch its best setting kept there."""

    level: float
    best: str
    steps: int
    running_batch: float | None  # time-weighted mean per DP rank over the best setting's points at this level
    points: list[str]


class EngineSchedule(TypedDict):
    """The schedule of one (workload, load mode) by running batch, in vLLM's and SGLang's words."""

    workload: str
    load_mode: str
    bands: list[BatchBand]
    ranges: list[list[int]]  # [start, end, steps], inclusive batch sizes
    vllm_speculative_config: VllmSpeculativeConfig | None  # None: no speculation anywhere (or no ranges)
    vllm_command: str | None
    sglang_adaptive_config: SglangAdaptiveConfig | None
    sglang_command: str | None
    files: dict[str, str]  # engine -> file name (rig report --engine-schedule DIR writes them)
    notes: list[str]


class EngineRangeRow(TypedDict):
    """One batch-size range of the schedule by running batch, flat (CSV, rig.open_run(...).section)."""

    workload: str
    load_mode: str
    start: int
    end: int
    steps: int
