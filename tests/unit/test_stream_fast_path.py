"""The per-read fast paths (whole chunks at once, a read's events as one JSON array, the inline fold) against the
step-by-step paths they stand in for: the same body bytes per read, the same events, the same records and errors."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from rig.loadgen import http1
from rig.loadgen.apis import OpenAIChat, OpenAICompletions, SGLangNative, StreamError
from rig.loadgen.client import Outcome, _Folder
from rig.loadgen.sse import SSEBytesParser

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


# ---------------------------------------------------------------- streams to cut up


def completion_events(n: int, chat: bool = False, ids: bool = False) -> list[bytes]:
    """vLLM-shaped events: n one-choice events (the last with a finish reason), the usage event; payloads only."""
    out = []
    for i in range(n):
        fr = "length" if i == n - 1 else None
        if chat:
            choice = {
                "index": 0,
                "delta": {"content": f" t{i}"} if i else {"role": "assistant", "content": ""},
                "finish_reason": fr,
            }
        else:
            choice = {"index": 0, "text": f" t{i}" if i != 2 else "", "logprobs": None, "finish_reason": fr}
            if ids:
                choice["token_ids"] = [i] * (1 + i % 3)
        out.append(
            json.dumps(
                {"id": "c-1", "object": "x", "created": 1, "model": "m", "choices": [choice], "usage": None}
            ).encode()
        )
    out.append(
        json.dumps(
            {
                "id": "c-1",
                "object": "x",
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
            }
        ).encode()
    )
    return out


def native_events(n: int) -> list[bytes]:
    out, text = [], ""
    for i in range(n):
        text += " tok"
        meta = {
            "prompt_tokens": 3,
            "completion_tokens": i + 1,
            "cached_tokens": 0,
            "finish_reason": {"type": "length"} if i == n - 1 else None,
        }
        out.append(json.dumps({"text": text, "meta_info": meta}).encode())
    return out


def sse(payloads: list[bytes], done: bool = True) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads) + (b"data: [DONE]\n\n" if done else b"")


def chunked(body: bytes, shape: str, rng: random.Random) -> bytes:
    """The SSE body framed as chunks of one shape, with the last chunk (and trailers for 'trailers')."""
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    if shape in ("one", "trailers"):
        pieces = events
    elif shape == "several":  # two or three events in one chunk
        pieces, i = [], 0
        while i < len(events):
            k = rng.randint(2, 3)
            pieces.append(b"".join(events[i : i + k]))
            i += k
    elif shape == "across":  # every event split over two chunks at a random byte
        pieces = []
        for e in events:
            cut = rng.randint(1, len(e) - 1)
            pieces += [e[:cut], e[cut:]]
    else:  # "mixed": any cut at all, and the same pieces framed in the ways servers may write them
        pieces, pos = [], 0
        while pos < len(body):
            k = rng.choice([1, 7, 40, 200, 500])
            pieces.append(body[pos : pos + k])
            pos += k
    out = []
    for p in pieces:
        size = b"%x" % len(p)
        if shape == "mixed":
            size = rng.choice([size, size.upper(), b"00" + size, size + b";ext=1", size + b' ;name="v"'])
        out.append(size + b"\r\n" + p + b"\r\n")
    out.append(b"0\r\nX-Trailer: 1\r\nX-Other: 2\r\n\r\n" if shape in ("trailers", "mixed") else b"0\r\n\r\n")
    return b"".join(out)


def cuts(raw: bytes, how: str, rng: random.Random) -> list[bytes]:
    """The raw response as the reads a socket might give it."""
    if how == "whole":
        return [raw]
    if how == "random":
        points = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, 40)))
        return [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=False)]
    step = int(how)
    return [raw[i : i + step] for i in range(0, len(raw), step)]


# ---------------------------------------------------------------- HTTP/1.1 chunked de-framing


class _Transport:
    def __init__(self):
        self.closed = False

    def write(self, data):
        pass

    def close(self):
        self.closed = True


class _Reads:
    """A sink that keeps every body delivery with its read's time."""

    def __init__(self):
        self.status, self.bodies = None, []

    def head(self, status, headers, at):
        self.status = status

    def body(self, data, at):
        self.bodies.append((data, at))


def exchange(reads: list[bytes]):
    """Feed one response read by read (read i arrives at time i); returns (sink, the message's end or error)."""

    async def go():
        pool = http1.Pool()
        conn = http1._Conn(pool)
        conn.key = ("h", 1)
        conn.connection_made(_Transport())
        sink = _Reads()
        fut = conn.send(b"POST / HTTP/1.1\r\n\r\n", sink)
        for i, r in enumerate(reads):
            conn.data_received(r, float(i))
        if not fut.done():
            return sink, "unfinished"
        return sink, (repr(fut.exception()) if fut.exception() else fut.result())

    return asyncio.run(go())


def without_whole_chunks(monkeypatch):
    monkeypatch.setattr(http1, "whole_chunks", lambda data, pos, body: pos)


@pytest.mark.parametrize("shape", ["one", "several", "across", "trailers", "mixed"])
@pytest.mark.parametrize("how", ["1", "2", "3", "7", "13", "150", "whole", "random"])
def test_chunked_bodies_per_read_are_those_of_the_step_by_step_parser(shape, how, monkeypatch):
    rng = random.Random(f"{shape}-{how}")
    body = sse(completion_events(30))
    reads = cuts(HEAD + chunked(body, shape, rng), how, rng)
    fast, end = exchange(reads)
    assert end is True and fast.status == 200
    assert b"".join(d for d, _ in fast.bodies) == body
    without_whole_chunks(monkeypatch)
    slow, slow_end = exchange(reads)
    # the same bytes handed over in the same reads: each event keeps the arrival time of the read that brought it
    assert fast.bodies == slow.bodies and slow_end is True


def test_whole_chunks_takes_the_vetted_chunks_and_leaves_the_rest():
    data = b"5\r\nhello\r\n3\r\nabc\r\n4;x=1\r\nwxyz\r\n2\r\nok\r\n0\r\n\r\n"
    body: list[bytes] = []
    pos = http1.whole_chunks(data, 0, body)
    assert body == [b"hello", b"abc"] and data[pos:].startswith(b"4;x=1\r\n")  # an extension: step by step
    body = []
    assert http1.whole_chunks(data, data.index(b"2\r\n"), body) == data.index(b"0\r\n") and body == [b"ok"]
    body = []
    assert http1.whole_chunks(b"5\r\nhel", 0, body) == 0 and body == []  # a chunk cut off by the read
    body = []
    assert http1.whole_chunks(b"5\r\nhello\r\n5\r\nhel", 0, body) == 10 and body == [b"hello"]
    body = []
    assert http1.whole_chunks(b"A\r\n0123456789\r\n", 0, body) == 0 and body == []  # uppercase: step by step


@pytest.mark.parametrize(
    "bad",
    [
        b"4\r\nhello\r\n",  # the size says less than the data
        b"9\r\nhello\r\n0\r\n\r\n",  # the size says more: the CRLF is not where it should be
        b"5\r\nhelloXX",  # no CRLF after the data
        b"zz\r\nhello\r\n",  # not a size at all
    ],
)
@pytest.mark.parametrize("how", ["1", "whole"])
def test_bad_framing_after_good_chunks_fails_alike(bad, how, monkeypatch):
    good = b"".join(b"%x\r\n%s\r\n" % (len(e) + 8, b"data: " + e + b"\n\n") for e in completion_events(5))
    reads = cuts(HEAD + good + bad, how, random.Random(0))
    fast = exchange(reads)
    assert fast[1].startswith("HTTPError(") and "bad chunked encoding" in fast[1]
    without_whole_chunks(monkeypatch)
    slow = exchange(reads)
    assert fast[1] == slow[1] and fast[0].bodies == slow[0].bodies


# ---------------------------------------------------------------- SSE: a read's events as one JSON array


def slow_feed(parser: SSEBytesParser, chunk: bytes) -> list[bytes]:
    """The line-by-line parser alone: the reference."""
    return parser._slow(parser._buf + chunk if parser._buf else chunk)


@pytest.mark.parametrize(
    "body",
    [
        sse(completion_events(6)),
        sse(completion_events(6), done=False),
        b"data: [DONE]\n\n",
        b'data: {"a": 1}\n\ndata: [DONE]\n\ndata: {"b": 2}\n\n',  # [DONE] not last: an event like any other
        b'data: {"a": 1}data: [DONE]\n\n',  # one event whose payload ends in "data: [DONE]"
        b'data: {"a": 1}\n\n: comment\n\ndata: {"b": 2}\n\n',
        b'data: {"a": 1}\r\n\r\ndata: {"b": 2}\r\n\r\n',
        b'data: {"a": 1}\ndata: {"b": 2}\n\ndata: {"c": 3}\n\n',  # two data lines in one event
        b'data: {"a": 1}\n\ndata: [1, 2]\n\ndata: {"c": 3}\n\n',  # a payload that is not an object
        b'data:{"a": 1}\n\ndata: {"b": 2}\n\n',
        b'event: x\ndata: {"a": 1}\n\n',
    ],
)
def test_events_as_one_array_are_the_events_line_by_line(body):
    for cut in range(len(body) + 1):
        fast, ref = SSEBytesParser(), SSEBytesParser()
        got, want = [], []
        for part in (body[:cut], body[cut:]):
            array, count, rest = fast.feed_objects(part)
            if count:
                objs = array[1:-1].split(b",\n")
                assert len(objs) == count and json.loads(array) == [json.loads(o) for o in objs]
                got += objs
            got += rest
            want += slow_feed(ref, part)
        assert got == want and fast.close() == ref.close()


# ---------------------------------------------------------------- the fold: records as event by event


def event_by_event(monkeypatch):
    """The folder as it was: each event parsed alone and folded by fold()."""
    monkeypatch.setattr(SSEBytesParser, "feed_objects", lambda self, chunk: (b"", 0, slow_feed(self, chunk)))


def fold_reads(api, reads: list[bytes]) -> tuple[Outcome, str | None]:
    out = Outcome(send_mono=0.0, end_mono=0.0)
    firsts: list[int] = []
    folder = _Folder(api, out, on_first=lambda: firsts.append(len(out.chunk_tokens)))
    error = None
    try:
        for i, r in enumerate(reads):
            folder.feed(r, float(i + 1))
        folder.close(float(len(reads) + 1))
    except StreamError as e:
        error = str(e)
    assert len(firsts) == (out.first_mono is not None)  # the first-token hook runs once, with the first token
    return out, error


def record(out: Outcome) -> dict:
    st = out.state
    return {
        "offsets": out.chunk_offsets,
        "tokens": out.chunk_tokens,
        "first": out.first_mono,
        "text": st.text,
        "status": out.status,
        "error": out.error,
        "done": st.done,
        "finished": st.finished,
        "finish_reason": st.finish_reason,
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": st.completion_tokens,
        "spec": st.speculative,
    }


STREAMS = {
    "completions": (OpenAICompletions(), sse(completion_events(40))),
    "completions-ids": (OpenAICompletions(), sse(completion_events(40, ids=True))),
    "chat": (OpenAIChat(), sse(completion_events(40, chat=True))),
    "native": (SGLangNative(), sse(native_events(40))),
    "malformed-mid": (OpenAICompletions(), sse(completion_events(8)[:4] + [b"{not json}"] + completion_events(8)[4:])),
    "two-objects": (OpenAICompletions(), sse(completion_events(8)[:3] + [b'{"a": 1},{"b": 2}'])),
    "error-mid": (OpenAIChat(), sse(completion_events(8, chat=True)[:3] + [b'{"error": {"message": "boom"}}'])),
    "bad-text": (OpenAICompletions(), sse(completion_events(6)[:2] + [b'{"choices": [{"text": 5}]}'])),
    "bad-delta": (OpenAIChat(), sse(completion_events(6, chat=True)[:2] + [b'{"choices": [{"delta": [1]}]}'])),
    "abort": (
        OpenAICompletions(),
        sse([b'{"choices": [{"text": "a"}]}', b'{"choices": [{"text": "", "finish_reason": "abort"}]}']),
    ),
    "no-done": (OpenAICompletions(), sse(completion_events(5), done=False)),
    # completions events the typed decoder does not take, or stops at: the rest go to fold() as dicts
    "usage-every-event": (
        OpenAICompletions(),
        sse(
            [
                e.replace(b'"usage": null', b'"usage": {"completion_tokens": %d}' % i)
                for i, e in enumerate(completion_events(30))
            ]
        ),
    ),
    "sglext-mid": (
        OpenAICompletions(),
        sse(
            completion_events(30)[:10]
            + [b'{"choices": [{"text": "s"}], "sglext": {"spec_tokens_details": {"spec_verify_ct": 3}}}']
            + completion_events(30)[10:]
        ),
    ),
    "choice-not-object": (
        OpenAICompletions(),
        sse(completion_events(6)[:2] + [b'{"choices": [{"text": "a"}, 5]}'] + completion_events(6)[2:]),
    ),
    "object-error": (OpenAICompletions(), sse(completion_events(6)[:3] + [b'{"object": "error", "message": "oom"}'])),
    "finish-dict": (OpenAICompletions(), sse([b'{"choices": [{"text": "a", "finish_reason": {"type": "stop"}}]}'])),
    "no-choices": (OpenAICompletions(), sse(completion_events(4)[:2] + [b'{"id": "x"}'])),
    "big-int-and-surrogate": (
        OpenAICompletions(),
        sse(
            completion_events(4)[:2]
            + [b'{"choices": [{"text": "\\ud800x", "token_ids": [123456789012345678901234567890]}]}']
            + completion_events(4)[2:]
        ),
    ),
    "cut": (OpenAICompletions(), sse(completion_events(5), done=False)[:-30]),
}


@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("how", ["1", "9", "100", "whole", "random"])
def test_records_are_those_of_the_event_by_event_fold(name, how, monkeypatch):
    api, body = STREAMS[name]
    reads = cuts(body, how, random.Random(f"{name}-{how}"))
    fast, fast_err = fold_reads(api, reads)
    event_by_event(monkeypatch)
    slow, slow_err = fold_reads(api, reads)
    assert record(fast) == record(slow) and fast_err == slow_err
    if name in ("completions", "chat", "native"):  # (one completions event has no text, the first chat one neither)
        assert fast.state.done and fast_err is None and len(fast.chunk_tokens) == 40 - (name != "native")
