"""What one streamed request came to (``Outcome``), how its events fold into it, and the request-specific part of
its record; shared by both HTTP clients (rig.loadgen.client: the lean one, rig.loadgen.aio_client: aiohttp)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import orjson

from rig.config import Timeouts
from rig.loadgen.apis import Api, StreamError, StreamState
from rig.loadgen.sse import SSEBytesParser, array_events
from rig.workloads.base import Turn

_log = logging.getLogger("rig.loadgen.client")


@dataclass
class Outcome:
    """The raw result of one request; times are monotonic seconds (time.perf_counter)."""

    send_mono: float
    end_mono: float
    first_mono: float | None = None
    chunk_offsets: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    state: StreamState = field(default_factory=StreamState)
    status: str = "ok"  # ok | failed | cancelled
    http_status: int | None = None
    error: str | None = None


def output_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:32]


def _loads(data: bytes) -> Any:
    """One event's JSON; bytes that are not UTF-8 are replaced (as a text reader would) instead of failing."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data.decode("utf-8", errors="replace"))
        except ValueError:
            text = data.decode("utf-8", errors="replace")
            raise StreamError(f"malformed event: not JSON: {text[:80]!r}") from None


class _Folder:
    """Folds a stream's SSE payloads into an Outcome; the arrival time of each piece is the read that brought it."""

    __slots__ = ("api", "out", "state", "parser", "send", "on_first")

    def __init__(self, api: Api, out: Outcome, on_first: Callable[[], None] | None = None) -> None:
        self.api = api
        self.out = out
        self.state = out.state
        self.parser = SSEBytesParser()
        self.send = out.send_mono
        self.on_first = on_first

    def feed(self, chunk: bytes, at: float) -> None:
        array, count, rest = self.parser.feed_objects(chunk)
        if count:
            folded = self.fold_array(array, count, at)
            if folded < count:  # a malformed event: it and the ones after it parsed one by one, in order
                rest = array_events(array)[folded:] + rest
        if rest:
            self.consume(rest, at)

    def fold_array(self, array: bytes, count: int, at: float) -> int:
        """Fold one read's events given as one JSON array text (every one arrived at that read); how many it did."""
        out = self.out
        tokens = out.chunk_tokens
        before = len(tokens)
        try:
            return self.api.fold_array(array, count, self.state, tokens)
        finally:  # also when an event raised: the ones before it keep their arrival
            added = len(tokens) - before
            if added:
                out.chunk_offsets.extend([at - self.send] * added)
                if out.first_mono is None:
                    out.first_mono = at
                    if self.on_first is not None:
                        self.on_first()

    def consume(self, events: list[bytes], at: float) -> None:
        """Fold events one by one, each parsed just before its fold ([DONE], malformed events, a stream's tail)."""
        if not events:
            return
        state, out, fold = self.state, self.out, self.api.fold
        offset = at - self.send  # every event of one read arrived at that read
        for obj in events:
            if obj[:1] != b"{" and obj.strip() == b"[DONE]":
                state.done = True
                continue
            obj = _loads(obj)
            n = fold(obj, state)
            if n > 0:
                if out.first_mono is None:
                    out.first_mono = at
                    if self.on_first is not None:
                        self.on_first()
                out.chunk_offsets.append(offset)
                out.chunk_tokens.append(n)

    def close(self, at: float) -> None:
        """End of the body: the last events, and whether the stream ended complete."""
        tail, cut = self.parser.close()
        try:
            self.consume(tail, at)
        except StreamError:
            if not cut:
                raise
            raise StreamError("truncated stream: ended mid-event") from None
        out, state = self.out, self.state
        if not state.done and not state.finished:
            out.status = "failed"
            out.error = "truncated stream: ended mid-event" if cut else "truncated stream: no finish reason"


def _timeout_error(out: Outcome, timeouts: Timeouts) -> None:
    if out.first_mono is None and timeouts.first_token_s < timeouts.total_s:
        out.status, out.error = "failed", f"timeout: no first token within {timeouts.first_token_s:g}s"
    else:
        out.status, out.error = "failed", f"timeout: stream not finished within {timeouts.total_s:g}s"


def unexpected_error(e: BaseException) -> str:
    """The one-line error of an exception no branch maps (a bug, or a server answer no branch foresaw)."""
    return f"internal error: {type(e).__name__}: {' '.join(str(e).split())}"[:300]


def _failed_by(out: Outcome, e: BaseException) -> None:
    """A network or protocol fault with no message of its own: the exception's type and text."""
    out.status, out.error = "failed", f"{type(e).__name__}: {e}"[:300]


def _cancelled(out: Outcome) -> None:
    """The run was stopped mid-request: the record says so (the caller re-raises the cancellation)."""
    out.status, out.error = "cancelled", "cancelled: the run was stopped"
    out.end_mono = time.perf_counter()


def _unexpected(out: Outcome, e: Exception) -> None:
    """A request's unexpected exception: a failed record of its own; the traceback goes to this process's log."""
    out.status, out.error = "failed", unexpected_error(e)
    _log.warning("request failed on an unexpected exception", exc_info=e)


def _no_usage(out: Outcome, api: Api) -> Outcome:
    """A stream that ended without the server's token count: failed, or -- in the plain dialect, where usage is
    the server's choice -- counted from its chunks, and the record says the count is an estimate."""
    st = out.state
    if out.status == "ok" and st.completion_tokens is None:
        if api.dialect.counts_chunks:
            st.completion_tokens = sum(out.chunk_tokens)
            st.tokens_source = "chunks"
        else:
            out.status, out.error = "failed", "server reported no completion token count"
    return out


def request_fields(turn: Turn, out: Outcome) -> dict[str, Any]:
    """The request-specific columns of a record (identity and point columns are added by the generator)."""
    st = out.state
    ttft = (out.first_mono - out.send_mono) if out.first_mono is not None else None
    rec: dict[str, Any] = {
        "request_id": turn.request_id,
        "turn": None,
        "category": turn.category,
        "ttft_s": ttft,
        "e2e_s": out.end_mono - out.send_mono,
        "chunk_offsets_s": out.chunk_offsets,
        "chunk_tokens": out.chunk_tokens,
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "cached_tokens": st.cached_tokens,
        "finish_reason": st.finish_reason,
        "completion_tokens_source": st.tokens_source if st.completion_tokens is not None else None,
        "status": out.status,
        "ok": out.status == "ok",
        "http_status": out.http_status,
        "error": out.error,
        "temperature": turn.temperature,
        "top_p": turn.top_p,
        "top_k": turn.top_k,
        "max_tokens": turn.max_tokens,
        "ignore_eos": turn.ignore_eos,
        "seed": turn.seed,
        "output_hash": output_hash(st.text) if out.status == "ok" else None,
        "output_chars": len(st.text),
    }
    rec.update(st.speculative)
    rec.update(st.server_ts)
    return rec


# What a generator counts of its ok requests (GeneratorReport fields of the same names).
OK_COUNTS = ("ended_early", "tokens_estimated", "chunk_tokens_mismatch", "chunk_gaps", "gaps_in_one_read")


def count_ok(counts: dict[str, int], out: Outcome, turn: Turn, tokens: int) -> None:
    """Add one ok request to the generator's OK_COUNTS."""
    # A fixed length asked for (ignore_eos) and not had: a dialect without ignore_eos, or a server that stopped
    # anyway. Said in the point's flags, never made up.
    if turn.ignore_eos and (out.state.finish_reason == "stop" or tokens < turn.max_tokens):
        counts["ended_early"] += 1
    if out.state.tokens_source == "chunks":
        counts["tokens_estimated"] += 1
    elif out.state.counted_by_text and sum(out.chunk_tokens) != tokens:  # ITL is off there
        counts["chunk_tokens_mismatch"] += 1
    if len(out.chunk_offsets) > 1:
        counts["chunk_gaps"] += len(out.chunk_offsets) - 1
        counts["gaps_in_one_read"] += gaps_in_one_read(out.chunk_offsets)


def gaps_in_one_read(offsets: list[float]) -> int:
    """Inter-chunk gaps of 0: a chunk that came in the same read as the one before, so both carry one arrival time
    (the client read later than the server's next write)."""
    return sum(1 for a, b in pairwise(offsets) if a == b)
