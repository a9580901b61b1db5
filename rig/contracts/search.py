"""The adaptive runs' manifest sections: ``Manifest.search`` (rig sweep --search) and ``Manifest.tune`` (rig tune).

Their settings carry each setting's command-line flag on its field (``json_schema_extra={"flag": ...}``, see
``flag``): rig/cli_options.py generates the click options from them, so a setting's flag, help text, default and
bounds are declared once. The SLO settings (--slo, --slo-percentile) are one declaration, ``SloSettings``, that both
search and tune inherit.

Older manifests wrote these sections as plain dicts with the same keys: every model allows extra keys and gives
every field a default (or accepts what older runs wrote), so they load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

MAX_CONCURRENCY = 1024  # the largest concurrency a search probes unless told (--search-max)
MAX_RATE = 1000.0  # requests/s: likewise for a rate search
DEFAULT_PERCENTILE = 99.0  # the percentile SLOs apply to unless told (--slo-percentile)


def flag(name: str, metavar: str | None = None, path: Literal["existing-file"] | None = None) -> dict[str, JsonValue]:
    """A field's command-line flag (and how click shows and checks its value), for ``json_schema_extra``."""
    out: dict[str, JsonValue] = {"flag": name}
    if metavar is not None:
        out["metavar"] = metavar
    if path is not None:
        out["path"] = path
    return out


class _Record(BaseModel):
    """A part of a section as written: extra keys (a newer or older rig's) are kept."""

    model_config = ConfigDict(extra="allow")


class SloSettings(BaseModel):
    """The SLOs an adaptive run answers to: shared by `rig sweep --search` and `rig tune` (one declaration)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    slos: tuple[str, ...] = Field(
        (),
        description="An SLO, repeatable (metrics: ttft, tpot, e2e), e.g. --slo ttft=500ms --slo tpot=50ms "
        "(sweep --search: every probe must meet it; tune: the answer; report: goodput and the best configuration).",
        json_schema_extra=flag("--slo", metavar="METRIC=VALUE"),
    )
    percentile: float = Field(
        DEFAULT_PERCENTILE,
        gt=0,
        le=100,
        description="The percentile the SLOs apply to.",
        json_schema_extra=flag("--slo-percentile"),
    )


class SearchSettings(SloSettings):
    """What an SLO search looks for; stored in the manifest so ``--resume`` repeats the same search."""

    variable: Literal["concurrency", "rate"] = Field(
        description="Instead of fixed levels: per configuration, the largest concurrency (rate) meeting every --slo.",
        json_schema_extra=flag("--search"),
    )
    start: float = 1  # the first value probed: the first --concurrency (--rate) value
    maximum: float | None = Field(
        None,
        gt=0,
        description=f"--search: the largest value to probe (default {MAX_CONCURRENCY} concurrency, "
        f"{MAX_RATE:g} req/s).",
        json_schema_extra=flag("--search-max"),
    )
    tolerance: float = Field(
        0.1,
        gt=0,
        description="--search rate: stop when min failing / max passing <= 1 + this.",
        json_schema_extra=flag("--search-tolerance"),
    )

    def top(self) -> float:
        """The largest value the search probes (--search-max, else the variable's default)."""
        if self.maximum is not None:
            return self.maximum
        return MAX_CONCURRENCY if self.variable == "concurrency" else MAX_RATE


class TuneSettings(SloSettings):
    """What tune looks for and how cautious it is; stored in the manifest so a resumed tune repeats itself."""

    start_profile: str | None = Field(
        None,
        description="Simulator profile the model starts from (default: the shipped reference profile).",
        json_schema_extra=flag("--start-profile", path="existing-file"),
    )
    confidence: float = Field(
        0.2,
        ge=0,
        le=10,
        description="Trust a prediction without measuring when it misses the SLO by more than this share of it.",
        json_schema_extra=flag("--confidence"),
    )
    max_rounds: int = Field(
        8, ge=1, le=100, description="Measure-and-refit rounds at most.", json_schema_extra=flag("--max-rounds")
    )
    fit_evals: int = Field(
        120,
        ge=10,
        le=5000,
        description="Objective evaluations per pass of each refit.",
        json_schema_extra=flag("--fit-evals"),
    )


# --- rig sweep --search ---------------------------------------------------------------------------------------------


class SearchProbe(_Record):
    """One probe of a search, as its result lists it."""

    value: int | float
    point: str
    meets: bool
    margin: float | None = None


class SearchResult(_Record):
    """One (server configuration, workload) search: its probes and its bracket."""

    server_config: str
    steps: int | None = None
    workload: str
    variable: str = "concurrency"
    status: str = "searching"  # searching | bracketed | ... (rig.tune.search.Bisection.outcome) | error
    probes: int = 0
    probe_points: list[SearchProbe] = Field(default_factory=list)
    # the probes at the bracket's ends, summarised (rig.tune.slo_search.summary_probe)
    max_passing: Mapping[str, Any] | None = None  # a ProbeSummary (rig.contracts.report) as written
    min_failing: Mapping[str, Any] | None = None
    error: str | None = None


class SearchSection(_Record):
    """``Manifest.search``."""

    settings: SearchSettings | None = None
    describe: str = ""  # the SLOs as text, e.g. 'p99 ttft <= 500 ms'
    results: list[SearchResult] = Field(default_factory=list)


# --- rig tune -------------------------------------------------------------------------------------------------------


class TuneProbe(_Record):
    """One point tune measured: why, what the model predicted, and (once measured) what it was."""

    round: int
    point: str
    server_config: str
    steps: int | None = None
    level: int
    why: str = ""
    predicted_meets: bool | None = None
    predicted_margin: float | None = None
    predicted_aggregate_tok_s: float | None = None
    predicted_decode_tok_s: float | None = None
    meets: bool | None = None  # None: not measured (yet, or it failed: see error)
    margin: float | None = None
    aggregate_tok_s: float | None = None
    decode_tok_s: float | None = None
    accept_length: float | None = None
    flags: list[str] | None = None
    error: str | None = None


class TuneLeader(_Record):
    server_config: str | None = None
    steps: int | None = None
    level: int | None = None


class TuneNext(_Record):
    server_config: str
    level: int
    why: str = ""


class TuneRound(_Record):
    """One measure-and-refit round: the fit, the leader it implies, and the points it decides to measure next."""

    round: int
    fit_objective: float | None = None
    profile: dict[str, float] = Field(default_factory=dict)
    leader: TuneLeader = Field(default_factory=TuneLeader)
    capacity: dict[str, int | None] = Field(default_factory=dict)
    next: list[TuneNext] = Field(default_factory=list)


class Recommendation(_Record):
    """Tune's answer, read off the measured points alone (``rig report``'s rule), with its evidence."""

    measured_points: int = 0
    grid_points: int = 0
    stable: bool = False
    stop_reason: str = ""
    per_workload: list[dict[str, Any]] = Field(default_factory=list)  # rig.analysis.frontier.best_per_slo rows
    best_steps: int | None = None
    server_config: str | None = None
    max_passing: int | float | None = None
    min_failing: int | float | None = None
    answer: str = ""
    evidence: str = ""


class TuneSection(_Record):
    """``Manifest.tune``."""

    settings: TuneSettings | None = None
    describe: str = ""
    ladder: list[int] = Field(default_factory=list)
    workload: str | None = None
    configs: dict[str, int | None] = Field(default_factory=dict)  # server config id -> steps
    probes: list[TuneProbe] = Field(default_factory=list)
    rounds: list[TuneRound] = Field(default_factory=list)
    recommendation: Recommendation | None = None
