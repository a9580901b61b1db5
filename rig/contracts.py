"""The contracts that cross package boundaries: point identity, request record, generator report, manifest, validity.

The runner writes them, the load generator fills them, analysis reads them: each shape is declared here once.
The request record's Parquet schema is generated from ``RequestRecord``; the manifest is versioned and validated on
read (older versions are migrated); a point's validity is judged by ``judge_point`` and nowhere else.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rig.loadgen.dialects import DialectName

MANIFEST_VERSION = 2


class ContractError(ValueError):
    """Data that does not fit its contract (a manifest that fails validation, a record with an unknown key)."""


# ---------------------------------------------------------------------------------------------------- point identity
class PointIdentity(BaseModel):
    """What makes a point the point it is: its configuration, workload and load level (paired across configs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    point: str
    server_config: str
    engine: str
    workload: str
    steps: int
    load_mode: str  # closed | poisson | gamma | trace
    concurrency: int | None
    rate: float | None
    repeat: int


IDENTITY_FIELDS: tuple[str, ...] = tuple(PointIdentity.model_fields)


def point_name(config_id: str, workload: str, concurrency: int | None, rate: float | None, mode: str,
               repeat: int) -> str:
    """A point's id: readable and deterministic, so a resumed sweep finds the same points."""
    level = f"c{concurrency}" if rate is None else f"r{rate:g}" + (f"c{concurrency}" if concurrency else "")
    if mode == "trace":
        level = "trace" + (f"c{concurrency}" if concurrency else "")
    rep = f"-rep{repeat}" if repeat else ""
    return f"{config_id}-{workload}-{level}{rep}"


class PointColumns(PointIdentity):
    """The columns every record of a point carries: its identity plus the run, the API and the server knobs."""

    run_id: str
    api: str
    server_args: str  # JSON of the point's server knobs, keys sorted

    def columns(self) -> dict[str, Any]:
        return self.model_dump()


# ---------------------------------------------------------------------------------------------------- request record
Int32 = Annotated[int, "int32"]
Int64 = Annotated[int, "int64"]


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """One row per request. Every column is nullable; the Parquet schema is generated from these fields.

    Times ending in _ts are wall-clock epoch seconds derived from one monotonic anchor per generator (not
    offset-corrected; add clock_offset_s to put them on the driver's clock); durations ending in _s come from the
    monotonic clock alone. The generator builds rows as plain dicts (``empty_record``) for speed and checks their
    width (``check_record``); this class is their declaration.
    """

    # identity of the point (PointColumns)
    run_id: str | None = None
    point: str | None = None
    engine: str | None = None
    workload: str | None = None
    api: str | None = None
    steps: Int32 | None = None
    server_config: str | None = None  # id of the server configuration (several points share one launch)
    server_args: str | None = None  # JSON of the point's server knobs
    load_mode: str | None = None  # closed | poisson | gamma | trace
    concurrency: Int32 | None = None  # closed loop: the level's concurrency (whole point, all generators)
    rate: float | None = None  # open loop: the level's target requests/s (whole point)
    repeat: Int32 | None = None
    generator: Int32 | None = None
    host: str | None = None
    clock_offset_s: float | None = None  # generator clock minus driver clock
    # identity of the request
    request_id: str | None = None
    session_id: str | None = None
    turn: Int32 | None = None
    category: str | None = None  # chat | code | greedy | agent | dataset
    # timing
    intended_send_ts: float | None = None
    send_ts: float | None = None
    first_token_ts: float | None = None
    end_ts: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    slip_s: float | None = None  # actual - intended send
    e2e_from_intended_s: float | None = None
    chunk_offsets_s: list[float] | None = None  # arrival of each non-empty chunk, from send
    chunk_tokens: list[Int32] | None = None  # tokens carried by each of those chunks
    # tokens, from the server
    prompt_tokens: Int64 | None = None
    completion_tokens: Int64 | None = None
    cached_tokens: Int64 | None = None
    finish_reason: str | None = None
    # where completion_tokens came from: usage (the server's count) | chunks (counted by the client: an estimate,
    # only for a plain-OpenAI server that sent no usage)
    completion_tokens_source: str | None = None
    # outcome
    status: str | None = None  # ok | failed | cancelled
    ok: bool | None = None
    http_status: Int32 | None = None
    error: str | None = None
    # sampling
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    max_tokens: Int32 | None = None
    ignore_eos: bool | None = None
    seed: Int64 | None = None
    # speculative decoding, where the engine reports it per request
    spec_verify_ct: Int64 | None = None
    spec_accept_length: float | None = None
    spec_accepted_drafts: Int64 | None = None
    spec_proposed_drafts: Int64 | None = None
    # server-side timestamps (SGLang meta_info with --enable-metrics), epoch seconds on the server's clock
    server_received_ts: float | None = None
    server_first_token_ts: float | None = None
    server_finished_ts: float | None = None
    server_queue_s: float | None = None
    # output
    output_hash: str | None = None
    output_chars: Int64 | None = None


def _arrow_type(hint: Any) -> Any:
    """The Arrow type of one field's annotation (``X | None``, X a scalar, an Int32/Int64 or a list of those)."""
    import pyarrow as pa

    scalars: dict[Any, Any] = {str: pa.string(), float: pa.float64(), bool: pa.bool_()}
    widths: dict[str, Any] = {"int32": pa.int32(), "int64": pa.int64()}
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if len(args) != 1:
            raise TypeError(f"a record field is one type or None, not {hint}")
        return _arrow_type(args[0])
    if typing.get_origin(hint) is Annotated:
        return widths[hint.__metadata__[0]]
    if typing.get_origin(hint) is list:
        return pa.list_(_arrow_type(args[0]))
    if hint in scalars:
        return scalars[hint]
    raise TypeError(f"no Arrow type for {hint}")


def record_schema() -> Any:
    """The Parquet schema of request records, generated from ``RequestRecord`` (names, order and types)."""
    import pyarrow as pa

    hints = typing.get_type_hints(RequestRecord, include_extras=True)
    return pa.schema([(f.name, _arrow_type(hints[f.name])) for f in fields(RequestRecord)])


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
_RECORD_WIDTH = len(RECORD_FIELDS)
_EMPTY_RECORD: dict[str, Any] = dict.fromkeys(RECORD_FIELDS)


def empty_record() -> dict[str, Any]:
    """A record with every column present and null."""
    return _EMPTY_RECORD.copy()


def check_record(row: dict[str, Any]) -> None:
    """Raise ContractError if ``row`` (built from ``empty_record``) gained a key that is not a column: it would
    vanish silently when written. A length test, so the generator can afford it on every record."""
    if len(row) != _RECORD_WIDTH:
        unknown = sorted(set(row) - set(RECORD_FIELDS))
        missing = sorted(set(RECORD_FIELDS) - set(row))
        raise ContractError(f"request record keys differ from RequestRecord: unknown {unknown}, missing {missing}")


def __getattr__(name: str) -> Any:
    """``REQUEST_SCHEMA`` and ``CONVERSION_ERRORS`` (what Arrow raises for a value that does not fit its column's
    type) are made on first use: importing pyarrow costs ~0.4 s that the CLI's start (``rig --version``, a bad
    flag) should not pay."""
    if name == "REQUEST_SCHEMA":
        globals()[name] = record_schema()
    elif name == "CONVERSION_ERRORS":
        import pyarrow as pa

        globals()[name] = (pa.ArrowException, TypeError, ValueError, OverflowError)
    else:  # other look-ups (e.g. typing's probes for __dunder__ names) must not import pyarrow
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return globals()[name]


def repair_record(row: dict[str, Any]) -> str:
    """Make a record Arrow cannot convert writable, in place; returns its new error line.

    Each value that does not fit its column becomes null, and the record a failed one whose error names those
    values: one bad value costs that record its outcome, never the other records of its part file (nor its own)."""
    import pyarrow as pa

    bad: list[str] = []
    for f in __getattr__("REQUEST_SCHEMA"):
        value = row.get(f.name)
        try:
            pa.array([value], type=f.type)
        except __getattr__("CONVERSION_ERRORS"):
            bad.append(f"{f.name}={' '.join(repr(value).split())[:40]} is not {f.type}")
            row[f.name] = None
    error = f"internal error: record not writable as typed: {'; '.join(bad) or 'no single bad value'} (written null)"
    was = row.get("error")
    if isinstance(was, str) and was:
        error += f"; it was: {was}"
    row.update(status="failed", ok=False, error=" ".join(error.split())[:300], output_hash=None)
    return str(row["error"])


def unknown_columns(keys: Sequence[str]) -> list[str]:
    """Keys that are not request record columns."""
    return sorted(set(keys) - set(RECORD_FIELDS))


# ---------------------------------------------------------------------------------------------------- generator report
class RecordCounts(BaseModel):
    """Records of a point (or one generator) by outcome."""

    model_config = ConfigDict(extra="forbid")

    ok: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return self.ok + self.failed + self.cancelled


GeneratorStatus = Literal["complete", "partial", "failed", "interrupted"]


class GeneratorReport(BaseModel):
    """What one generator reports for one point (the driver adds what gathering its part files found)."""

    model_config = ConfigDict(extra="forbid")

    generator: int
    host: str | None = None
    status: GeneratorStatus | None = None
    error: str | None = None
    rows_written: int = 0
    rows_unwritten: int | None = None
    rows_repaired: int = 0  # records Arrow could not convert, written as failed ones (``repair_record``)
    parts: list[str] | None = None
    scheduled: int = 0
    records: RecordCounts = Field(default_factory=RecordCounts)
    tokens: int | None = None
    ended_early: int = 0  # ok requests that asked for a fixed length (ignore_eos) and ended before max_tokens
    tokens_estimated: int = 0  # ok requests whose completion tokens were counted from chunks (no usage sent)
    slip_p50_s: float | None = None
    slip_p99_s: float | None = None
    achieved_rate: float | None = None  # requests/s: see ``achieved_rate``
    rate_ratio: float | None = None  # open loop: achieved / scheduled rate of session starts (1.0 = kept up)
    window_s: float | None = None  # the generator's level window (monotonic)
    loop_lag_p50_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    cpu_pct: float | None = None
    shipped_parts: int | None = None  # with results_uri: parts copied to the shared store
    ship_errors: list[str] | None = None
    gathered: dict[str, int] | None = None  # the driver: part files brought into the run directory


def achieved_rate(n_sends: int, first_send: float, last_send: float) -> float | None:
    """Requests per second actually sent: intervals between sends over the span of send times (None below two)."""
    span = last_send - first_send
    return (n_sends - 1) / span if n_sends > 1 and span > 0 else None


class WindowAcceptance(BaseModel):
    """Speculative acceptance over a point's window from the engine's own counters (deltas; warm-up excluded).

    SGLang counts tokens per verify call; vLLM counts drafts, draft tokens and accepted tokens."""

    model_config = ConfigDict(extra="forbid")

    accept_length: float | None = None  # mean tokens committed per step that verified a draft (None: no drafts)
    generation_tokens: float | None = None
    verify_calls: float | None = None  # SGLang
    drafts: float | None = None  # vLLM: steps with a draft
    draft_tokens: float | None = None  # vLLM: tokens proposed
    accepted_tokens: float | None = None  # vLLM: tokens accepted
    accept_rate: float | None = None  # vLLM: accepted / proposed
    tokens_per_step: float | None = None  # vLLM: generated tokens per decode step over all steps


# ---------------------------------------------------------------------------------------------------- validity
class Thresholds(BaseModel):
    """The limits a point's validity is judged by; recorded in the manifest with every run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slip_p99_ms: float = Field(default=10.0, gt=0)  # open loop: a generator's p99 send slip above this
    loop_lag_p99_ms: float = Field(default=50.0, gt=0)  # a generator's event-loop lag p99 above this
    cpu_pct: float = Field(default=90.0, gt=0)  # a generator's CPU share at or above this
    rate_ratio: float = Field(default=0.99, gt=0)  # open loop: achieved / scheduled send rate below this
    min_window_s: float = Field(default=2.0, ge=0)  # lag or CPU over a shorter generator window is not evidence

    def with_overrides(self, text: str) -> "Thresholds":
        """These thresholds with ``name=value[,name=value...]`` applied; ContractError on a bad one."""
        updates: dict[str, float] = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in type(self).model_fields:
                raise ContractError(f"--thresholds: {item!r} is not NAME=VALUE with NAME one of "
                                    f"{', '.join(type(self).model_fields)}")
            try:
                updates[name] = float(value)
            except ValueError:
                raise ContractError(f"--thresholds: {name} must be a number, not {value.strip()!r}") from None
        try:
            return type(self).model_validate({**self.model_dump(), **updates})
        except ValidationError as e:
            err = e.errors()[0]
            raise ContractError(f"--thresholds: {err['loc'][0]} {err['msg'].lower()}") from None


# Flags judge_point decides (the others a point carries come from its status and its records on disk).
JUDGED_FLAGS = frozenset({"client_saturated", "schedule_slip", "rate_shortfall", "generator_lost", "server_died"})


def judge_point(load_mode: str | None, generators: Sequence[GeneratorReport], thresholds: Thresholds,
                server_died: str | None = None) -> dict[str, str]:
    """The point's validity flags, each with the figure that tripped it: the one place these rules live.

    A generator saturated (CPU share or event-loop lag over a window long enough to mean something), an open loop
    that slipped behind its schedule or sent below its rate, a generator lost, the server dead.
    """
    t = thresholds
    why: dict[str, str] = {}
    open_loop = load_mode not in (None, "closed")
    for g in generators:
        name = f"generator {g.generator}"
        if g.status == "failed" or "died" in (g.error or ""):
            why["generator_lost"] = f"{name}: {g.error}" if g.error else f"{name} failed"
        # A lag percentile or a CPU share over a blink of time (every request failing in milliseconds) means nothing.
        if g.window_s is None or g.window_s >= t.min_window_s:
            over = f" over {g.window_s:.0f}s" if g.window_s is not None else ""
            if (g.cpu_pct or 0) >= t.cpu_pct:
                why["client_saturated"] = f"{name} used {g.cpu_pct:.0f}% CPU (limit {t.cpu_pct:.0f}%){over}"
            elif (g.loop_lag_p99_ms or 0) > t.loop_lag_p99_ms:
                why["client_saturated"] = (f"{name} event-loop lag p99 {g.loop_lag_p99_ms:.0f} ms "
                                           f"(limit {t.loop_lag_p99_ms:.0f} ms)")
        if not open_loop:
            continue
        slip_ms = 1e3 * (g.slip_p99_s or 0)
        if slip_ms > t.slip_p99_ms:
            why["schedule_slip"] = f"{name} send slip p99 {slip_ms:.1f} ms (limit {t.slip_p99_ms:g} ms)"
            why.setdefault("client_saturated", f"{name} fell behind its schedule (send slip p99 {slip_ms:.1f} ms)")
        if (g.rate_ratio or 1.0) < t.rate_ratio:
            why["rate_shortfall"] = f"{name} sent at {100 * (g.rate_ratio or 0):.0f}% of the scheduled rate"
            why.setdefault("client_saturated", f"{name} sent below its scheduled rate")
    if server_died is not None:
        why["server_died"] = server_died
    return dict(sorted(why.items()))


# ---------------------------------------------------------------------------------------------------- manifest
PointStatus = Literal["pending", "running", "complete", "partial", "failed", "interrupted"]


class PointEntry(BaseModel):
    """One point in the manifest: identity (the fields of PointIdentity), status, counts, generators, verdict.

    The identity fields are optional here only because analysis also opens sparse or damaged manifests (it then
    fills them from the point's rows); the runner always writes them all.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)  # the runner updates entries field by field

    point: str
    server_config: str | None = None
    engine: str | None = None
    workload: str | None = None
    steps: int | None = None
    load_mode: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    repeat: int | None = None
    status: PointStatus | None = None
    error: str | None = None
    api: str | None = None
    started_ts: float | None = None
    start_wall: float | None = None  # the common start the generators waited for (driver clock)
    ended_ts: float | None = None
    requests_planned: int | None = None  # None: bound by duration
    requests_scheduled: int | None = None
    records: RecordCounts = Field(default_factory=RecordCounts)
    warmup_ok: int | None = None
    window_acceptance: WindowAcceptance | None = None  # engine counters over the point's window
    server_counters_delta: dict[str, float] | None = None
    flush_cache: Any = None  # the server's answer to /flush_cache, when asked
    gpu_telemetry: dict[str, Any] | None = None  # the GPU sampler over the point: samples, failed rounds, last error
    flags: list[str] = Field(default_factory=list)  # judge_point's verdict (sorted)
    flag_reasons: dict[str, str] = Field(default_factory=dict)  # each flag with the figure that tripped it
    generators: list[GeneratorReport] = Field(default_factory=list)

    @classmethod
    def new(cls, identity: PointIdentity) -> "PointEntry":
        """A pending entry for a point about to be run."""
        return cls(**identity.model_dump(), status="pending", requests_scheduled=0)

    def identity(self) -> PointIdentity | None:
        """The point's identity, or None when the entry lacks part of it."""
        try:
            return PointIdentity.model_validate({k: getattr(self, k) for k in IDENTITY_FIELDS})
        except ValidationError:
            return None

    def set_verdict(self, flags: dict[str, str]) -> None:
        self.flags = sorted(flags)
        self.flag_reasons = dict(sorted(flags.items()))


class GpuTelemetry(BaseModel):
    """The server node's GPU telemetry for one server configuration (rig.server.gpu_telemetry): where its samples
    come from, or why there are none."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["nvml", "simulated"] | None = None  # None: absent
    absent_reason: str | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)  # NVML index, uuid, name, power limit (mW)
    node_ip: str | None = None
    clock_offset_s: float | None = None  # server node clock - driver clock (gpu_metrics ts - offset = driver time)
    note: str | None = None  # e.g. that simulated figures come from the simulator's power model


class ServerConfigEntry(BaseModel):
    """One server configuration (several points share one launch): what was asked, what ran, how it went."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    engine: str | None = None
    knobs: dict[str, Any] = Field(default_factory=dict)  # as requested
    status: str | None = None  # starting | ready | failed
    error: str | None = None
    command: list[str] | None = None
    url: str | None = None
    node_ip: str | None = None
    gpu_ids: list[Any] | None = None
    ready_after_s: float | None = None
    startup: dict[str, Any] | None = None
    server_info: Any = None  # the engine's own JSON answers, as they came
    model_info: Any = None
    info: dict[str, Any] | None = None
    effective: dict[str, Any] | None = None  # rig.server.effective: what the server really ran
    warnings: list[str] | None = None
    stopped: bool | None = None
    ready_probe: str | None = None  # the path that first answered 200 (/health, else /v1/models)
    dialect: DialectName | None = None  # the fields its requests carried (rig.loadgen.dialects)
    dialect_source: str | None = None  # engine | probe:<path> | user | default (no probe identified the server)
    extra_body: dict[str, Any] | None = None  # the fields --extra-body added to every request, exactly as sent
    telemetry: GpuTelemetry | None = None  # GPU samples (gpu_metrics) or why there are none


class GeneratorHost(BaseModel):
    """Where one load generator ran and its clock (the cluster layout adds placement details)."""

    model_config = ConfigDict(extra="allow")

    generator: int
    host: str | None = None
    clock_offset_s: float | None = None  # generator clock minus driver clock
    clock_rtt_s: float | None = None


class ClusterInfo(BaseModel):
    """The cluster the run used; ``generators`` is what analysis reads, the rest is recorded for people."""

    model_config = ConfigDict(extra="allow")

    generators: list[GeneratorHost] = Field(default_factory=list)


class Manifest(BaseModel):
    """results/<run>/manifest.json: the run's spec, cluster, server configurations and points."""

    model_config = ConfigDict(extra="forbid")

    version: int = MANIFEST_VERSION
    run_id: str | None = None
    status: str | None = None  # running | complete | partial | failed | interrupted
    created: float | None = None
    spec: dict[str, Any] | None = None  # the RunSpec as JSON (rig.config owns its shape)
    versions: dict[str, str] = Field(default_factory=dict)
    thresholds: Thresholds | None = None  # what the points' flags were judged by
    cluster: ClusterInfo = Field(default_factory=ClusterInfo)
    server_configs: dict[str, ServerConfigEntry] = Field(default_factory=dict)
    points: list[PointEntry] = Field(default_factory=list)
    resumed: list[float] | None = None
    error: str | None = None
    stop_reason: str | None = None
    finished: float | None = None
    search: dict[str, Any] | None = None  # rig sweep --search: its settings and steps (rig.tune owns the shape)
    tune: dict[str, Any] | None = None  # rig tune: likewise

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Manifest":
        """A manifest from its JSON object as read from disk: an older version is migrated, then validated."""
        return cls.model_validate(migrate(data))

    def entry(self, point: str) -> PointEntry:
        return next(p for p in self.points if p.point == point)

    def clock_offsets(self) -> dict[int, float]:
        """Clock offset (generator - driver) of each generator, for rows that lack one."""
        return {g.generator: g.clock_offset_s for g in self.cluster.generators if g.clock_offset_s is not None}

    def to_json(self) -> str:
        # fallback=str: the engines' own JSON answers are recorded as they came (as the manifest always did)
        return json.dumps(self.model_dump(mode="json", fallback=str), indent=2) + "\n"


def thresholds_of_spec(spec: dict[str, Any] | None) -> Thresholds:
    """The thresholds a run with this recorded spec judged by (its load's slip and lag limits, the rest default)."""
    load = (spec or {}).get("load") or {}
    over: dict[str, float] = {}
    if isinstance(load.get("slip_threshold_s"), (int, float)):
        over["slip_p99_ms"] = 1e3 * load["slip_threshold_s"]
    if isinstance(load.get("loop_lag_threshold_s"), (int, float)):
        over["loop_lag_p99_ms"] = 1e3 * load["loop_lag_threshold_s"]
    return Thresholds(**over)


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A manifest of any earlier version as the current version (a copy; the file on disk is not touched).

    Version 1 (no ``version`` key, written before 2026-12-01) had no thresholds or flag reasons: its runner judged
    slip and loop lag, and analysis added a CPU rule at report time. Its points are judged again here by
    judge_point with the thresholds its spec recorded, so their reports read as they did.
    """
    version = data.get("version", 1)
    if not isinstance(version, int) or version > MANIFEST_VERSION:
        raise ValueError(f"manifest version {version!r} is newer than this rig understands ({MANIFEST_VERSION})")
    if version == MANIFEST_VERSION:
        return data
    out = dict(data, version=MANIFEST_VERSION)
    spec = out.get("spec") if isinstance(out.get("spec"), dict) else None
    thresholds = thresholds_of_spec(spec)
    out["thresholds"] = thresholds.model_dump()
    mode_of_run = ((spec or {}).get("load") or {}).get("mode")
    points = []
    for raw in out.get("points") or []:
        if not isinstance(raw, dict):
            points.append(raw)
            continue
        entry = dict(raw)
        try:
            gens = [GeneratorReport.model_validate(g) for g in entry.get("generators") or []]
        except ValidationError:
            points.append(raw)  # left as it is: validating the manifest names what is wrong, and where
            continue
        stored = [str(f) for f in entry.get("flags") or []]
        died = str(entry.get("error")) if "server_died" in stored and entry.get("error") else None
        judged = judge_point(entry.get("load_mode", mode_of_run), gens, thresholds, died)
        reasons = {f: "set by the run (see the manifest)" for f in stored}
        reasons.update(judged)
        entry["flags"] = sorted(reasons)
        entry["flag_reasons"] = dict(sorted(reasons.items()))
        points.append(entry)
    out["points"] = points
    return out


def parse_manifest(text: str, where: str = "manifest.json") -> Manifest:
    """A manifest from its JSON text: validated, older versions migrated; ContractError (one line) otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"{where} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ContractError(f"{where} is not a JSON object")
    try:
        return Manifest.from_data(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise ContractError(f"{where}: {loc}: {err['msg']}") from None
    except ValueError as e:  # a version this rig does not know
        raise ContractError(f"{where}: {e}") from None
