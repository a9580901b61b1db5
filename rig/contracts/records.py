"""The request record: one row per request; its Parquet schema is generated from ``RequestRecord``."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Annotated, Any

from rig.contracts.errors import ContractError

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
    request_id: str | None = None  # the pairing key: the same request at every point of a run
    wire_request_id: str | None = None  # the id sent to the server (SGLang's rid): request_id@tag, unique per attempt
    session_id: str | None = None
    turn: Int32 | None = None
    phase: Int32 | None = None  # a load profile's phase the request was due in (manifest: the point's phases)
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
