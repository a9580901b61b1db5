"""The contracts that cross package boundaries: point identity, request record, generator report, manifest, validity,
and the report's rows.

The runner writes them, the load generator fills them, analysis reads them: each shape is declared here once, one
module per seam (``point``, ``dialect``, ``records``, ``generator``, ``validity``, ``manifest``, ``search``, ``server``,
``report``, ``live``), and re-exported here.
The request record's Parquet schema is generated from ``RequestRecord``; the manifest is versioned and validated on
read (older versions are migrated); a point's validity is judged by ``judge_point`` and nowhere else.
"""

from __future__ import annotations

from typing import Any

from rig.contracts import records as _records
from rig.contracts.dialect import ENGINE_DIALECTS, DialectName, probe_paths
from rig.contracts.errors import ContractError
from rig.contracts.generator import (
    GeneratorEntry,
    GeneratorInfo,
    GeneratorReport,
    GeneratorStatus,
    HostCorpus,
    RecordCounts,
    TreeFingerprint,
    WindowAcceptance,
    achieved_rate,
    generator_entry,
)
from rig.contracts.live import GeneratorProgress, LatencySketch, ServerGauges
from rig.contracts.manifest import (
    MANIFEST_VERSION,
    ClusterInfo,
    GeneratorHost,
    Manifest,
    PointEntry,
    PointStatus,
    ServerConfigEntry,
    migrate,
    parse_manifest,
)
from rig.contracts.point import IDENTITY_FIELDS, PointColumns, PointIdentity, point_name
from rig.contracts.prove import ArmResult, ProveArm, ProveBand, ProveSection, ProveSettings, ScheduleSlot
from rig.contracts.records import (
    RECORD_FIELDS,
    Int32,
    Int64,
    RequestRecord,
    check_record,
    empty_record,
    record_schema,
    repair_record,
    unknown_columns,
)
from rig.contracts.report import (
    PROBE_SUMMARY_FIELDS,
    CampaignRow,
    ErrorCount,
    GateVerdict,
    GoodputRow,
    LosslessResult,
    Probe,
    ProbeSummary,
    Row,
    ServerRow,
    SloCheck,
    SloVerdict,
)
from rig.contracts.search import (
    DEFAULT_PERCENTILE,
    MAX_CONCURRENCY,
    MAX_RATE,
    Recommendation,
    SearchProbe,
    SearchResult,
    SearchSection,
    SearchSettings,
    SloSettings,
    TuneLeader,
    TuneNext,
    TuneProbe,
    TuneRound,
    TuneSection,
    TuneSettings,
)
from rig.contracts.server import (
    EffectiveConfig,
    FlushAnswer,
    GpuSamplerStats,
    GpuTelemetry,
    KnobChange,
    Knobs,
    KnobValue,
    ServerDescription,
    ServerReady,
    ServerStarted,
    StartupFacts,
    WaitProgress,
)
from rig.contracts.validity import DISTURBED_FLAGS, JUDGED_FLAGS, Thresholds, judge_point, thresholds_of_spec

__all__ = [
    "ArmResult",
    "ProveArm",
    "ProveBand",
    "ProveSection",
    "ProveSettings",
    "ScheduleSlot",
    "DEFAULT_PERCENTILE",
    "MAX_CONCURRENCY",
    "MAX_RATE",
    "Recommendation",
    "SearchProbe",
    "SearchResult",
    "SearchSection",
    "SearchSettings",
    "SloSettings",
    "TuneLeader",
    "TuneNext",
    "TuneProbe",
    "TuneRound",
    "TuneSection",
    "TuneSettings",
    "MANIFEST_VERSION",
    "CampaignRow",
    "ClusterInfo",
    "ContractError",
    "ErrorCount",
    "GateVerdict",
    "GeneratorHost",
    "GeneratorEntry",
    "GeneratorInfo",
    "GeneratorProgress",
    "LatencySketch",
    "ServerGauges",
    "GeneratorReport",
    "GeneratorStatus",
    "GoodputRow",
    "GpuTelemetry",
    "HostCorpus",
    "IDENTITY_FIELDS",
    "Int32",
    "Int64",
    "DISTURBED_FLAGS",
    "DialectName",
    "ENGINE_DIALECTS",
    "JUDGED_FLAGS",
    "LosslessResult",
    "Manifest",
    "PointColumns",
    "PointEntry",
    "PointIdentity",
    "PointStatus",
    "PROBE_SUMMARY_FIELDS",
    "Probe",
    "ProbeSummary",
    "RECORD_FIELDS",
    "RecordCounts",
    "RequestRecord",
    "Row",
    "ServerConfigEntry",
    "EffectiveConfig",
    "FlushAnswer",
    "GpuSamplerStats",
    "KnobChange",
    "KnobValue",
    "Knobs",
    "ServerDescription",
    "ServerReady",
    "ServerStarted",
    "StartupFacts",
    "WaitProgress",
    "ServerRow",
    "SloCheck",
    "SloVerdict",
    "Thresholds",
    "TreeFingerprint",
    "WindowAcceptance",
    "achieved_rate",
    "check_record",
    "empty_record",
    "generator_entry",
    "judge_point",
    "migrate",
    "parse_manifest",
    "point_name",
    "probe_paths",
    "record_schema",
    "repair_record",
    "thresholds_of_spec",
    "unknown_columns",
]


def __getattr__(name: str) -> Any:
    """``REQUEST_SCHEMA`` and ``CONVERSION_ERRORS`` are made on first use (``rig.contracts.records``): importing
    pyarrow costs ~0.4 s that the CLI's start should not pay."""
    return getattr(_records, name)
