"""What a load generator reports for a point, and the engine's acceptance over the point's window."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field


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
    chunk_tokens_mismatch: int = 0  # ok requests whose per-chunk token counts do not sum to completion_tokens
    chunk_gaps: int = 0  # gaps between successive chunks of ok requests
    gaps_in_one_read: int = 0  # of those, gaps of 0: the chunk came in the same read as the one before
    # a level bound by a duration: seconds into it when its sessions ran out (a finite dataset), None if they did not
    ran_out_s: float | None = None
    slip_p50_s: float | None = None
    slip_p99_s: float | None = None
    achieved_rate: float | None = None  # requests/s: see ``achieved_rate``
    rate_ratio: float | None = None  # open loop: achieved / scheduled rate of session starts (1.0 = kept up)
    window_s: float | None = None  # the generator's level window (monotonic)
    loop_lag_p50_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    cpu_pct: float | None = None
    # seconds from this generator getting its start call to the common start (driver clock; < 0: it came late)
    start_notice_s: float | None = None
    shipped_parts: int | None = None  # with results_uri: parts copied to the shared store
    ship_errors: list[str] | None = None
    gathered: dict[str, int] | None = None  # the driver: part files brought into the run directory


class GeneratorInfo(BaseModel):
    """What a generator actor says of itself (``LoadGenerator.info``); validated on the driver, where it comes back
    over Ray. ``spool_root``: where it writes part files on its host (filled in for that host)."""

    model_config = ConfigDict(extra="forbid")

    generator: int
    host: str
    node_ip: str
    node_id: str | None = None  # None outside Ray (tests)
    pid: int
    spool_root: str


class GeneratorEntry(TypedDict):
    """The driver's record of one started generator: what it said of itself (GeneratorInfo's fields, in its
    order), then its clock against the driver's and where its part files go (rig.placement.gather.set_outputs).
    The manifest records it under ``cluster.generators``."""

    generator: int
    host: str
    node_ip: str
    node_id: str | None
    pid: int
    spool_root: str
    output_mode: NotRequired[str]  # direct | shared | ship | spool
    ship_uri: NotRequired[str | None]
    clock_offset_s: NotRequired[float]
    clock_rtt_s: NotRequired[float]


def generator_entry(info: GeneratorInfo) -> GeneratorEntry:
    """A started generator's entry, before its clock and output are known."""
    return GeneratorEntry(
        generator=info.generator,
        host=info.host,
        node_ip=info.node_ip,
        node_id=info.node_id,
        pid=info.pid,
        spool_root=info.spool_root,
    )


class TreeFingerprint(BaseModel):
    """What a source tree holds, in one digest (``rig.workloads.source.tree_fingerprint``)."""

    model_config = ConfigDict(extra="forbid")

    root: str
    files: int
    sha256: str
    default: bool = False  # the tree rig ships (no code_dir given)


class HostCorpus(BaseModel):
    """A generator host's answer to ``LoadGenerator.corpus``: per workload that quotes source code, the fingerprint
    of the tree that host would quote -- or why it cannot read them."""

    model_config = ConfigDict(extra="forbid")

    fingerprints: dict[str, TreeFingerprint] = Field(default_factory=dict)
    error: str | None = None


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
