"""results/<run>/manifest.json: versioned, validated on read, older versions migrated."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rig.contracts.adaptive import AdaptiveTable
from rig.contracts.dialect import DialectName
from rig.contracts.errors import ContractError
from rig.contracts.generator import GeneratorReport, RecordCounts, WindowAcceptance
from rig.contracts.point import IDENTITY_FIELDS, PointIdentity
from rig.contracts.profile import LoadPhase
from rig.contracts.prove import ProveSection
from rig.contracts.search import SearchSection, TuneSection
from rig.contracts.server import EffectiveConfig, GpuTelemetry, StartupFacts
from rig.contracts.validity import Thresholds, judge_point, thresholds_of_spec

MANIFEST_VERSION = 2


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
    rerun: str | None = None  # why a resume ran this point again (its earlier rows are in superseded/)
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
    # a load profile's phases, each with its start_s from start_wall (records carry the phase index)
    phases: list[LoadPhase] | None = None

    @classmethod
    def new(cls, identity: PointIdentity) -> PointEntry:
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
    startup: StartupFacts | None = None  # what the engine's startup log said
    server_info: Any = None  # the engine's own JSON answers, as they came
    model_info: Any = None
    info: dict[str, Any] | None = None
    effective: EffectiveConfig | None = None  # rig.server.effective: what the server really ran
    warnings: list[str] | None = None
    stopped: bool | None = None
    ready_probe: str | None = None  # the path that first answered 200 (/health, else /v1/models)
    dialect: DialectName | None = None  # the fields its requests carried (rig.loadgen.dialects)
    dialect_source: str | None = None  # engine | probe:<path> | user | default (no probe identified the server)
    extra_body: dict[str, Any] | None = None  # the fields --extra-body added to every request, exactly as sent
    telemetry: GpuTelemetry | None = None  # GPU samples (gpu_metrics) or why there are none
    adaptive: AdaptiveTable | None = None  # SGLang --speculative-adaptive: its candidate table (rig.server.adaptive)


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
    search: SearchSection | None = None  # rig sweep --search: its settings and results
    tune: TuneSection | None = None  # rig tune: its settings, probes, rounds and recommendation
    prove: ProveSection | None = None  # rig prove: its arms, the schedule it measured, the verdict per band

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Manifest:
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
