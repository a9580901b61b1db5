"""The HTTP server's state and SGLang's native endpoints (SGLang's entrypoints/http_server.py) over the real-time
engine."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

import rig
from rig.sim import faults
from rig.sim.args import ServerArgs
from rig.sim.capacity import Capacity
from rig.sim.engine import Engine, Stream
from rig.sim.profile import Profile
from rig.sim.prometheus import CONTENT_TYPE, SimMetrics
from rig.sim.requests import Sampling
from rig.sim.resolution import MODEL_ARCH
from rig.sim.responses import native_body
from rig.sim.rids import DuplicateRid, Rids
from rig.sim.sampling import BadRequest, ContractError, parse_native
from rig.sim.text import token_id, tokenize

log = logging.getLogger("rig.sim")
access_log = logging.getLogger("rig.sim.access")
ALWAYS_ALLOWED = ("/health", "/ready", "/metrics")
ADMIN_PATHS = ("/flush_cache",)


class SimServer:
    """State shared by the handlers: resolved args, profile, capacity, engine, metrics, readiness."""

    def __init__(
        self,
        args: ServerArgs,
        profile: Profile,
        capacity: Capacity,
        engine: Engine,
        metrics: SimMetrics,
        context_len: int,
        profile_path: str,
    ):
        self.args = args
        self.profile = profile
        self.capacity = capacity
        self.engine = engine
        self.metrics = metrics
        self.context_len = context_len
        self.profile_path = profile_path
        self.ready = False
        self.shutting_down = False
        self.started = time.time()
        self.model = args.served_model_name
        self.chat_defaults: dict[str, Any] = {}  # the model's generation defaults for chat (generation.py)
        self.rids = Rids(engine)  # client-given rids of unfinished requests (SGLang's rid_to_state)

    # ---- shared helpers for the native and OpenAI routes ----
    def submit(
        self, toks: list[str], ids: list[int], s: Sampling, *, rid: str | None, stops: tuple[str, ...] = ()
    ) -> Stream:
        """Queue a request with the seed SGLang would use: sampling_seed counts only with
        --enable-deterministic-inference, where an unseeded request gets 42 (sampling/sampling_batch_info.py);
        otherwise the seed is accepted and ignored and the draw comes from the server's RNG."""
        seed = (42 if s.seed is None else s.seed) if self.args.enable_deterministic_inference else None
        if seed != s.seed:
            s = dataclasses.replace(s, seed=seed)
        self.rids.check(rid)
        st = self.engine.submit(toks, ids, s, rid=rid, stops=stops)
        self.rids.register(rid, st)
        return st

    def tokenize_prompt(self, text: str | None, ids: Any) -> tuple[list[str], list[int]]:
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise BadRequest("input_ids must be a list of integers (batched requests are not supported)")
            return [str(i) for i in ids], list(ids)
        if not isinstance(text, str):
            raise BadRequest("text must be a string (batched requests are not supported by the simulator)")
        toks = tokenize(text)
        return toks, [token_id(t) for t in toks]

    def check_length(self, n_prompt: int, max_new: int) -> None:
        if n_prompt + max_new > self.context_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {self.context_len} tokens. "
                f"You requested a total of {n_prompt + max_new} tokens: {n_prompt} tokens from the input messages "
                f"and {max_new} tokens for the completion. Please reduce the number of tokens in the input messages "
                f"or the completion to fit within the limit."
            )

    async def updates(self, st: Stream, request: web.Request) -> AsyncIterator[int]:
        """Yield each time the stream has new tokens or finished; aborts the request if the client goes away."""
        sent = -1
        try:
            while True:
                await st.event.wait()
                st.event.clear()
                if st.n_tokens != sent or st.finished:
                    sent = st.n_tokens
                    yield sent
                if st.finished:
                    return
        finally:
            if not st.finished:
                self.engine.abort(st)
            self.rids.release(st, streamed=True)

    async def wait_finished(self, st: Stream) -> None:
        try:
            while not st.finished:
                await st.event.wait()
                st.event.clear()
        finally:
            if not st.finished:
                self.engine.abort(st)
            self.rids.release(st, streamed=False)


def validation_error(message: str) -> web.Response:
    """http_server.py::validation_exception_handler: a request that fails FastAPI/pydantic validation gets 400 and
    ErrorResponse with type 'Bad Request' (not FastAPI's default 422)."""
    return web.json_response(
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}, status=400
    )


def error_json(message: str, status: int = 400) -> web.Response:
    """http_server.py::_create_error_response: the native routes' refusal is the message alone (recorded on 0.5.17:
    err_generate_no_text, err_generate_too_long_nostream)."""
    return web.json_response({"error": {"message": message}}, status=status)


def stream_error(message: str) -> dict[str, Any]:
    """http_server.py::stream_results: a ValueError inside a /generate stream, as 0.5.17 sent it (recorded:
    err_generate_too_long_stream, err_duplicate_live_rid)."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}


async def read_json(request: web.Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def start_sse(request: web.Request) -> web.StreamResponse:
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    resp = faults.stream_response(request, headers) or web.StreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    return resp


def sse(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


# ---------------------------------------------------------------- middleware
def make_middlewares(srv: SimServer) -> list:
    @web.middleware
    async def auth_and_log(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        key = srv.args.api_key
        if path.startswith(ADMIN_PATHS) and srv.args.admin_api_key:
            key = srv.args.admin_api_key
        denied = key and not path.startswith(ALWAYS_ALLOWED)
        if denied and request.headers.get("Authorization", "") != f"Bearer {key}":
            resp: web.StreamResponse = web.json_response({"error": "Unauthorized"}, status=401)
            _access(request, resp.status)
            return resp
        try:
            resp = await handler(request)
        except ContractError as e:  # http_server.py::generate_request: the schema check's text, as a string
            resp = web.json_response({"error": str(e)}, status=400)
        except BadRequest as e:
            resp = error_json(str(e))
        except web.HTTPNotFound:  # FastAPI's answer to an unknown route (recorded on 0.5.17: err_not_found)
            resp = web.json_response({"detail": "Not Found"}, status=404)
        _access(request, resp.status)
        return resp

    return [auth_and_log]


def _access(request: web.Request, status: int) -> None:
    if access_log.isEnabledFor(logging.INFO):
        peer = request.transport.get_extra_info("peername") if request.transport else None
        who = f"{peer[0]}:{peer[1]}" if peer else "-"
        access_log.info('%s - "%s %s HTTP/1.1" %d', who, request.method, request.path_qs, status)


# ---------------------------------------------------------------- health and info
def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in ("1", "true", "yes")


async def health(request: web.Request) -> web.Response:
    """entrypoints/http_server.py::health_generate (both /health and /health_generate): 503 while starting or
    shutting down; otherwise submit a 1-token generation (not counted in metrics) and answer 200 once any
    scheduler output arrives, checking once a second (so at least 1 s), 503 after SGLANG_HEALTH_CHECK_TIMEOUT
    (20 s). Plain /health skips the generation only with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0."""
    srv: SimServer = request.app["srv"]
    if not srv.ready or srv.shutting_down:
        return web.Response(status=503)
    if request.path == "/health" and not _env_flag("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True):
        return web.Response(status=200 if srv.engine.alive else 503)
    loop = asyncio.get_running_loop()
    tic = loop.time()
    timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
    st = (
        srv.engine.submit(["0"], [0], Sampling(max_new_tokens=1, temperature=0.0), rid=None, log_metrics=False)
        if srv.engine.alive
        else None
    )
    try:
        while loop.time() < tic + timeout:
            await asyncio.sleep(1.0)
            if srv.engine.last_output > tic:
                return web.Response(status=200)
        log.error("Health check failed. Server couldn't get a response from detokenizer for last %g seconds.", timeout)
        return web.Response(status=503)
    finally:
        if st is not None and not st.finished:
            srv.engine.abort(st)


def server_info_dict(srv: SimServer) -> dict[str, Any]:
    args = srv.args.as_dict()
    cap = srv.capacity
    eng = srv.engine
    state: dict[str, Any] = dict(args)
    state.update(
        {
            "last_gen_throughput": eng.last_gen_throughput,
            "effective_max_running_requests_per_dp": cap.max_running_requests,
            "memory_usage": {
                "weight": cap.weight_gb_per_gpu,
                "kvcache": cap.kv_pool_gb,
                "startup_available": cap.available_gpu_mem_gb,  # scheduler_components/memory_usage.py
                "token_capacity": cap.max_total_num_tokens,
                "token_capacity_swa": None,  # no sliding-window pool
                "graph": srv.profile.graph_reserve_gb,
                "mamba_state": cap.state_pool_gb,
            },
            "world_size": srv.args.tp_size,
            # the scheduler's server_args carry the resolved state-pool size (kv_cache_configurator.py overrides it)
            "max_mamba_cache_size": cap.max_mamba_cache_size,
            "startup_time": srv.started,
        }
    )
    if eng.sched.adaptive is not None:
        # the scheduler's view carries the worker's active tier (eagle_worker_v2.py overrides it into the internal
        # state); the top-level fields keep the startup value
        state["speculative_num_steps"] = eng.sched.active_steps
    if srv.args.speculative and eng.avg_spec_accept_length is not None:
        state["avg_spec_accept_length"] = eng.avg_spec_accept_length
    info = dict(args)
    info.update(
        {
            "launch_command": srv.args.launch_command,  # SGLang's build_server_info (srt/utils/common.py)
            "max_total_num_tokens": cap.max_total_num_tokens,
            "max_req_input_len": srv.context_len - 5,
            "startup_time": srv.started,
            "status": "ready" if srv.ready else "starting",
            "internal_states": [state],
            "version": f"{rig.__version__}-rig-sim",
            "frontend": "python",
            "sim": {
                "profile": srv.profile.name,
                "profile_path": srv.profile_path,
                "state_limit_max_running_requests": cap.state_limit,
                "state_mb_per_request": cap.state_mb_per_request,
                "mamba_ratio": cap.mamba_ratio,
            },
        }
    )
    return info


async def server_info(request: web.Request) -> web.Response:
    return web.json_response(server_info_dict(request.app["srv"]))


async def get_server_info(request: web.Request) -> web.Response:
    log.warning(
        "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
        "Please use '/server_info' instead."
    )
    return await server_info(request)


async def model_info(request: web.Request) -> web.Response:
    srv: SimServer = request.app["srv"]
    return web.json_response(
        {
            "model_path": srv.args.model_path,
            "tokenizer_path": srv.args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "qwen3_5_moe",
            "architectures": [MODEL_ARCH],
            "served_model_name": srv.model,
        }
    )


async def models(request: web.Request) -> web.Response:
    srv: SimServer = request.app["srv"]
    return web.json_response({"object": "list", "data": [_model_card(srv)]})


async def model_one(request: web.Request) -> web.Response:
    srv: SimServer = request.app["srv"]
    name = request.match_info["name"]
    if name != srv.model:
        return web.json_response(
            {
                "object": "error",
                "message": f"The model `{name}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": "model_not_found",
            },
            status=404,
        )
    return web.json_response(_model_card(srv))


def _model_card(srv: SimServer) -> dict:
    return {
        "id": srv.model,
        "object": "model",
        "created": int(srv.started),
        "owned_by": "sglang",
        "root": srv.model,
        "parent": None,
        "max_model_len": srv.context_len,
    }


async def metrics(request: web.Request) -> web.Response:
    srv: SimServer = request.app["srv"]
    if not srv.args.enable_metrics:
        raise web.HTTPNotFound()
    return web.Response(body=srv.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


SIM_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell (simulated)"


async def sim_gpu(request: web.Request) -> web.Response:
    """GET /sim/gpu (a sim-only route, like the --sim-* flags; SGLang has none): the simulated draw of each of the
    tp GPUs in NVML's units (rig/sim/power.py), which the server actor samples as it samples NVML on a GPU node.
    Temperature, SM clock and throttle reasons are not modelled: null."""
    srv: SimServer = request.app["srv"]
    eng = srv.engine
    now = eng.loop.time()
    watts, busy, memory = eng.power.window(now)
    energy_mj = int(eng.power.energy_j(now) * 1000)
    cap = srv.capacity
    total = int(srv.profile.gpu_mem_gb * 1e9)
    used = int(max(0.0, srv.profile.gpu_mem_gb - cap.available_gpu_mem_gb) * 1e9)
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-SIM-{i:08d}",
            "name": SIM_GPU_NAME,
            "power_mw": int(watts * 1000),
            "energy_mj": energy_mj,
            "util_gpu_pct": int(round(busy * 100)),
            "util_mem_pct": int(round(memory * 100)),
            "mem_used_bytes": used,
            "mem_total_bytes": total,
            "power_limit_mw": int(srv.profile.gpu_board_power_w * 1000),
            "sm_clock_mhz": None,
            "temperature_c": None,
            "throttle_reasons": None,
        }
        for i in range(eng.tp)
    ]
    return web.json_response({"source": "simulated", "ts": eng.wall(now), "profile": srv.profile.name, "gpus": gpus})


async def flush_cache(request: web.Request) -> web.Response:
    """entrypoints/http_server.py::flush_cache + managers/scheduler_components/flush_wrapper.py: without
    ?timeout= (or 0) it flushes only when idle, else 400; with a timeout it waits for idle up to that long."""
    srv: SimServer = request.app["srv"]
    raw = request.query.get("timeout", "0")
    try:
        timeout = float(raw)
        problem = None if timeout >= 0.0 else "Input should be greater than or equal to 0"
    except ValueError:
        timeout, problem = 0.0, "Input should be a valid number, unable to parse string as a number"
    if problem:  # Query(0.0, ge=0.0) fails validation; http_server.py's handler answers 400, not FastAPI's 422
        return validation_error(f"query.timeout: {problem} (input: {raw!r})")
    message = None
    if timeout > 0.0 and srv.engine.sched.busy:
        deadline = time.monotonic() + timeout
        while srv.engine.sched.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if srv.engine.sched.busy:
            message = "Timed out waiting for idle state."
    if message is None and srv.engine.flush_cache():
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )
    if message is None:
        log.warning(
            "Cache not flushed because there are pending requests. #queue-req: %d, #running-req: %d",
            len(srv.engine.sched.waiting),
            len(srv.engine.sched.running),
        )
    return web.Response(status=400, text=message or "Flush cache failed.\n")


# ---------------------------------------------------------------- native /generate
async def generate(request: web.Request) -> web.StreamResponse:
    srv: SimServer = request.app["srv"]
    body = await read_json(request)
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")  # as 0.5.17 words it
    sampling, stops = parse_native(body.get("sampling_params"))
    toks, tok_ids = srv.tokenize_prompt(text, ids)
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("rid must be a string")
    stream = bool(body.get("stream", False))
    em = srv.args.enable_metrics
    try:
        srv.check_length(len(tok_ids), sampling.max_new_tokens)
    except BadRequest as e:
        if not stream:
            raise
        resp = await start_sse(request)  # SGLang reports validation failures inside the stream (http_server.py)
        await resp.write(sse(json.dumps(stream_error(str(e)))))
        await resp.write(DONE)
        srv.rids.refused_stream(rid)
        return resp
    try:
        st = srv.submit(toks, tok_ids, sampling, rid=rid, stops=stops)
    except DuplicateRid as e:
        if not stream:  # http_server.py::_create_error_response
            return web.json_response({"error": {"message": str(e)}}, status=400)
        resp = await start_sse(request)  # http_server.py::stream_results: the ValueError inside the stream
        await resp.write(sse(json.dumps(stream_error(str(e)))))
        await resp.write(DONE)
        srv.rids.refused_stream(rid)
        return resp
    if not stream:
        await srv.wait_finished(st)
        return web.Response(text=native_body(st, srv.engine, enable_metrics=em), content_type="application/json")
    resp = await start_sse(request)
    try:
        async for _ in srv.updates(st, request):
            await resp.write(sse(native_body(st, srv.engine, enable_metrics=em)))
        await resp.write(DONE)
    except (ConnectionResetError, asyncio.CancelledError):
        srv.engine.abort(st)
        raise
    return resp
