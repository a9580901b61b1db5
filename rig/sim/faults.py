"""Test-only fault injection for the simulated server: ``--sim-fault SPEC`` (repeatable).

The sim misbehaves on purpose so the rig's fault handling can be tested against it exactly as against SGLang (the
rig passes the flag through verbatim: ``--server-arg=--sim-fault --server-arg=http=503,every=4``). Nothing here runs
unless a ``--sim-fault`` flag is given.

SPEC is ``KIND[=VALUE][,key=value...]``. Server-wide faults:

- ``crash_after=N``   the process dies (SIGKILL, or ``code=C``: exit code C) when generation request N+1 arrives
- ``crash_at=T``      ... T seconds after the first generation request arrived
- ``slow=F``          every engine iteration takes F times as long (F > 0; F < 1 speeds it up)
- ``stall=S``         the process stops for S seconds, once, ``at=T`` seconds (default 0) after the first generation
  request arrived: its event loop is blocked, as a busy host blocks it (the simulator's clock then falls behind)

Per-request faults (the first listed fault that selects a request applies to it):

- ``http=STATUS``     answer with that status (400..599) and an SGLang-style JSON error body
- ``hang``            accept the request, never send anything (until the client goes away)
- ``hang_headers``    send 200 and the event-stream headers, then never a first token
- ``truncate``        end the stream cleanly in the middle of an event (after ``after=K`` whole events, default 1)
- ``reset``           drop the connection in the middle of an event (after ``after=K`` whole events, default 1)
- ``malformed=text``  event number ``after=K`` (default 0: the first) is not JSON
- ``malformed=meta``  ... is JSON without ``meta_info`` (OpenAI routes: without ``choices``)
- ``content_type``    answer 200 with ``application/json`` (the final object) instead of ``text/event-stream``

Selectors (per-request faults; default: every generation request):

- ``every=K[,offset=O]``   request number i (1-based, in arrival order) is selected when (i - O) % K == 0
- ``fraction=P[,seed=S]``  selected when a hash of (S, rid) is below P: the same request ids at every run and at any
  concurrency (requests without a rid are keyed by their number). A rid's ``@tag`` suffix (rig tags each attempt:
  rig.loadgen.wire_ids) is left out of the hash, so the same requests are selected at every attempt

Generation requests are POST /generate, /v1/completions and /v1/chat/completions (the sim's own warm-up and
/health_generate are not counted; the rig's warm-up requests are). Stream faults act on streamed responses only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from aiohttp.abc import AbstractStreamWriter

log = logging.getLogger("rig.sim")
GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
SERVER_KINDS = ("crash_after", "crash_at", "slow", "stall")
REQUEST_KINDS = ("http", "hang", "hang_headers", "truncate", "reset", "malformed", "content_type")
STREAM_KINDS = ("hang_headers", "truncate", "reset", "malformed", "content_type")
_KEYS = {"every", "offset", "fraction", "seed", "after", "code", "at"}


class FaultSpecError(ValueError):
    """A --sim-fault value that cannot be understood (one line)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    value: Any = None  # crash_after N, crash_at T, slow F, http status, malformed mode
    every: int | None = None
    offset: int = 0
    fraction: float | None = None
    seed: int = 0
    after: int | None = None  # stream faults: whole events sent before the fault
    code: int | None = None  # crash: exit code instead of SIGKILL
    at: float = 0.0  # stall: seconds after the first generation request
    spec: str = ""

    def selects(self, index: int, rid: str | None) -> bool:
        if self.every is not None:
            return (index - self.offset) % self.every == 0
        if self.fraction is not None:
            key = rid.split("@", 1)[0] if rid is not None else f"#{index}"
            return hash_unit(self.seed, key) < self.fraction
        return True

    @property
    def events_before(self) -> int:
        if self.after is not None:
            return self.after
        return 0 if self.kind == "malformed" else 1


def hash_unit(seed: int, key: str) -> float:
    """A stable number in [0, 1) for (seed, key): the same on every machine and Python run."""
    h = hashlib.sha256(f"{seed}|{key}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _num(
    name: str, raw: str, kind: type, lo: float | None = None, hi: float | None = None, lo_open: bool = False
) -> Any:
    try:
        v = kind(raw)
    except ValueError:
        raise FaultSpecError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise FaultSpecError(f"{name} must be {'>' if lo_open else '>='} {lo:g}, got {raw}")
    if hi is not None and v > hi:
        raise FaultSpecError(f"{name} must be <= {hi:g}, got {raw}")
    return v


def _fault_options(kind: str, parts: list[str]) -> dict[str, str]:
    """The ``key=value`` options after a fault's kind, each known and given once."""
    opts: dict[str, str] = {}
    for p in parts:
        k, eq, v = p.partition("=")
        if k not in _KEYS or not eq:
            raise FaultSpecError(
                f"{kind}: unknown option {p!r} (options: key=value with key in {', '.join(sorted(_KEYS))})"
            )
        if k in opts:
            raise FaultSpecError(f"{kind}: option {k!r} given twice")
        opts[k] = v
    return opts


# The value each fault kind takes (none for the others): its parser.
_VALUE_OF: dict[str, Callable[[str], Any]] = {
    "crash_after": lambda v: _num("crash_after", v, int, 0),
    "crash_at": lambda v: _num("crash_at", v, float, 0),
    "slow": lambda v: _num("slow", v, float, 0, 1000, lo_open=True),
    "stall": lambda v: _num("stall", v, float, 0, 600, lo_open=True),
    "http": lambda v: _num("http", v, int, 400, 599),
    "malformed": lambda v: _malformed(v),
}


def _malformed(value: str) -> str:
    if value not in ("text", "meta"):
        raise FaultSpecError(f"malformed must be 'text' (not JSON) or 'meta' (no meta_info), got {value!r}")
    return value


def _allowed_options(kind: str) -> set[str]:
    if kind in ("crash_after", "crash_at"):
        return {"code"}
    if kind == "stall":
        return {"at"}
    if kind in REQUEST_KINDS:
        return {"every", "offset", "fraction", "seed"} | (
            {"after"} if kind in ("truncate", "reset", "malformed") else set()
        )
    return set()


def _check_option_combination(kind: str, opts: dict[str, str]) -> None:
    extra = set(opts) - _allowed_options(kind)
    if extra:
        raise FaultSpecError(f"{kind} does not take {', '.join(sorted(extra))}")
    if "every" in opts and "fraction" in opts:
        raise FaultSpecError(f"{kind}: give every= or fraction=, not both")
    if "offset" in opts and "every" not in opts:
        raise FaultSpecError(f"{kind}: offset= needs every=")
    if "seed" in opts and "fraction" not in opts:
        raise FaultSpecError(f"{kind}: seed= needs fraction=")


def parse_fault(spec: str) -> Fault:
    """'http=503,every=4' -> Fault; raises FaultSpecError with a one-line reason."""
    parts = [p.strip() for p in spec.split(",")]
    if not parts or not parts[0]:
        raise FaultSpecError(f"empty fault spec {spec!r}")
    kind, eq, value = parts[0].partition("=")
    kind = kind.strip()
    if kind not in SERVER_KINDS + REQUEST_KINDS:
        raise FaultSpecError(f"unknown fault {kind!r} (known: {', '.join(SERVER_KINDS + REQUEST_KINDS)})")
    opts = _fault_options(kind, parts[1:])
    parse_value = _VALUE_OF.get(kind)
    if parse_value is not None and not eq:
        raise FaultSpecError(f"{kind} needs a value ({kind}=...)")
    if parse_value is None and eq:
        raise FaultSpecError(f"{kind} takes no value (got {kind}={value})")
    val = parse_value(value) if parse_value is not None else None
    _check_option_combination(kind, opts)

    def opt(name: str, kind_: type, lo: float | None = None, hi: float | None = None) -> Any:
        return _num(name, opts[name], kind_, lo, hi) if name in opts else None

    return Fault(
        kind=kind,
        value=val,
        every=opt("every", int, 1),
        offset=opt("offset", int, 0) or 0,
        fraction=opt("fraction", float, 0, 1),
        seed=opt("seed", int) or 0,
        after=opt("after", int, 0),
        code=opt("code", int, 0, 255),
        at=opt("at", float, 0, 3600) or 0.0,
        spec=spec,
    )


def argparse_type(spec: str) -> Fault:
    """For argparse: a bad spec becomes argparse's one-line error (exit 2)."""
    import argparse

    try:
        return parse_fault(spec)
    except FaultSpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class FaultPlan:
    """The faults of one server process and the count of generation requests seen so far."""

    def __init__(self, faults: list[Fault] | tuple[Fault, ...] = ()):
        self.faults = list(faults)
        self.per_request = [f for f in self.faults if f.kind in REQUEST_KINDS]
        self.crash_after = next((f for f in self.faults if f.kind == "crash_after"), None)
        # Timed from the first generation request (_TIMED): the first fault of each such kind.
        self.timed = list({f.kind: f for f in reversed(self.faults) if f.kind in _TIMED}.values())
        slow = [f.value for f in self.faults if f.kind == "slow"]
        self.time_scale = slow[-1] if slow else 1.0
        self.seen = 0
        self._timers: list[asyncio.Task] = []  # started with the first generation request

    def __bool__(self) -> bool:
        return bool(self.faults)

    def choose(self, index: int, rid: str | None) -> Fault | None:
        """The per-request fault for request number ``index`` (1-based) with this rid, if any."""
        return next((f for f in self.per_request if f.selects(index, rid)), None)


def crash(fault: Fault, why: str) -> None:
    log.error("sim fault: crashing (%s): %s", fault.spec, why)
    for h in logging.getLogger("rig.sim").handlers:
        h.flush()
    if fault.code is not None:
        os._exit(fault.code)
    os.kill(os.getpid(), signal.SIGKILL)


async def _crash_later(fault: Fault) -> None:
    await asyncio.sleep(float(fault.value))
    crash(fault, f"{fault.value:g} s after the first generation request")


async def _stall_later(fault: Fault) -> None:
    await asyncio.sleep(fault.at)
    log.warning("sim fault: stalling the process for %g s (%s)", fault.value, fault.spec)
    time.sleep(float(fault.value))  # blocking on purpose: nothing in this process runs, as on a host that stalls it


# The server-wide faults timed from the first generation request, each with what it does when its time comes.
_TIMED: dict[str, Callable[[Fault], Coroutine[Any, Any, None]]] = {"crash_at": _crash_later, "stall": _stall_later}


async def _rid(request: web.Request) -> str | None:
    try:
        body = await request.json()  # the body is cached: the handler reads it again
    except Exception:
        return None
    rid = body.get("rid") if isinstance(body, dict) else None
    return rid if isinstance(rid, str) else None


def _gone(request: web.BaseRequest, srv: Any) -> bool:
    t = request.transport
    return t is None or t.is_closing() or bool(getattr(srv, "shutting_down", False))


async def _wait_gone(request: web.BaseRequest, srv: Any) -> None:
    while not _gone(request, srv):
        await asyncio.sleep(0.1)


class FaultInjected(ConnectionResetError):
    """Raised by a faulty stream's write once the fault has ended the response (the handler aborts its request)."""


class FaultyStream(web.StreamResponse):
    """A streamed response that breaks in the configured way; the handler writes SSE events to it as usual."""

    def __init__(self, fault: Fault, srv: Any, *, headers: dict[str, str]):
        self.fault = fault
        self.srv = srv
        self.events = 0  # whole events written
        self.ended = False
        self.fired = False
        self._last_json: bytes | None = None
        if fault.kind == "content_type":
            headers = {**headers, "Content-Type": "application/json"}
        super().__init__(status=200, headers=headers)

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        out = await super().prepare(request)
        self._request = request
        if self.fault.kind == "hang_headers" and self._payload_writer is not None:
            send = getattr(self._payload_writer, "send_headers", None)  # aiohttp sends headers with the body
            if send is not None:
                send()
                await self._payload_writer.drain()
        return out

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.ended:
            raise FaultInjected("sim fault: response already ended")
        if self.fault.kind == "hang_headers":  # the first token never leaves the server
            await _wait_gone(self._request, self.srv)
            self.ended = True
            raise FaultInjected("sim fault: hang after headers")
        data = bytes(data)
        payload = data[len(b"data: ") :].rstrip(b"\n") if data.startswith(b"data: ") else data
        kind = self.fault.kind
        if payload != b"[DONE]":
            self._last_json = payload
        if kind == "content_type":
            if payload == b"[DONE]":  # the end of the stream: one JSON body, as a non-streaming answer
                await super().write(self._last_json or b"{}")
                await self._end()
            return
        done = payload == b"[DONE]"
        if self.fired or (self.events < self.fault.events_before and not done):
            self.events += 1
            await super().write(data)
            return
        # The fault's event (or the end of a stream shorter than after=K: the fault still happens, on the last event)
        self.fired = True
        if kind == "malformed":
            last = self._last_json if done else payload
            if self.fault.value == "text":
                bad = b"data: {not json: " + (last or b"")[:24] + b"\n\n"
            else:
                obj = json.loads(last or b"{}")
                obj.pop("meta_info", None) if "meta_info" in obj else obj.pop("choices", None)
                bad = b"data: " + json.dumps(obj).encode() + b"\n\n"
            self.events += 1
            await super().write(bad)
            if done:
                await super().write(data)
            return
        # truncate / reset: half an event, then the end
        await super().write(data[: max(1, len(data) // 2)])
        if kind == "reset":
            t = self._request.transport
            if t is not None:
                t.abort()
            self.ended = True
            raise FaultInjected("sim fault: connection reset mid-event")
        await self._end()

    async def _end(self) -> None:
        self.ended = True
        await super().write_eof()
        raise FaultInjected(f"sim fault: {self.fault.kind}")

    async def write_eof(self, data: bytes = b"") -> None:
        if self.ended:
            return
        await super().write_eof(data)


def stream_response(request: web.Request, headers: dict[str, str]) -> web.StreamResponse | None:
    """The faulty stream for this request, if a stream fault selected it (server.start_sse asks)."""
    fault = request.get("sim_fault")
    if fault is None or fault.kind not in STREAM_KINDS:
        return None
    resp = FaultyStream(fault, request.app["srv"], headers=headers)
    request["sim_fault_resp"] = resp
    return resp


def middleware(plan: FaultPlan) -> Callable:
    """Counts generation requests, crashes on schedule, and applies per-request faults."""

    @web.middleware
    async def inject(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method != "POST" or request.path not in GENERATION_PATHS:
            return await handler(request)
        srv = request.app["srv"]
        plan.seen += 1
        index = plan.seen
        if plan.crash_after is not None and index > plan.crash_after.value:
            crash(plan.crash_after, f"generation request {index} arrived")
        if plan.timed and not plan._timers:
            plan._timers = [asyncio.get_running_loop().create_task(_TIMED[f.kind](f)) for f in plan.timed]
        rid = await _rid(request) if plan.per_request else None
        fault = plan.choose(index, rid)
        if fault is None:
            return await handler(request)
        log.info("sim fault: request %d (rid %s): %s", index, rid, fault.spec)
        if fault.kind == "http":
            status = int(fault.value)
            return web.json_response(
                {"error": {"message": f"sim fault: injected HTTP {status}", "type": "SimFault", "code": status}},
                status=status,
            )
        if fault.kind == "hang":
            await _wait_gone(request, srv)
            return web.Response(status=499)
        request["sim_fault"] = fault
        try:
            return await handler(request)
        except FaultInjected:
            resp = request.get("sim_fault_resp")
            return resp if resp is not None else web.Response(status=499)

    return inject


def install(srv: Any) -> list[Callable]:
    """Apply the server-wide faults to the engine; the middleware for the rest (empty without --sim-fault)."""
    plan = FaultPlan(getattr(srv.args, "sim_fault", None) or ())
    if not plan:
        return []
    srv.engine.time_scale = plan.time_scale
    log.warning("sim faults enabled (test only): %s", "; ".join(f.spec for f in plan.faults))
    return [middleware(plan)]
