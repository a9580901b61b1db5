"""A stand-in for `python -m sglang.launch_server` used by rig's tests (never shipped in the package).

It accepts exactly the options of SGLang 0.5.23's parser (the generated table in rig/sim/data), resolves the
speculative settings as SGLang does, and serves a small, deterministic slice of SGLang's HTTP contract: /generate,
/v1/completions, /v1/chat/completions, /flush_cache, /server_info, /health, /metrics. Each rule names the SGLang
file it comes from; tests/integration/test_sglang_conformance.py checks it and the simulator against the same
statements.

Greedy output is a deterministic function of the prompt, so it is identical at every steps value unless
RIG_DOUBLE_LOSSY_STEPS=N makes it differ at steps N (a deliberately lossy server for the losslessness check).
Sampled output depends on sampling_seed only with --enable-deterministic-inference, as in SGLang.
Other switches: RIG_DOUBLE_CRASH_AFTER=n (exit after n generation calls), RIG_DOUBLE_HANG=1 (accept, never
answer), RIG_DOUBLE_FAIL_START=1 (exit 3 before becoming healthy), RIG_DOUBLE_TOKEN_DELAY=seconds per chunk
(default 0.01).
"""

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import sys
import time

from aiohttp import web

from rig.sim.args import _add_sglang_arguments, load_table
from rig.sim.resolution import refusal, resolve_backends


def parse() -> argparse.Namespace:
    """SGLang's own option set (prefix matching, choices, types); a bad flag exits 2 like argparse."""
    p = argparse.ArgumentParser(prog="sglang serve")
    _add_sglang_arguments(p, load_table()["arguments"])
    ns = p.parse_args()
    found = refusal(ns)  # the resolution hooks' asserts and ValueErrors, as the simulator applies them
    if found:
        p.error(found)
    # arg_groups/speculative_hook.py::_handle_eagle_family (NEXTN is EAGLE; (3,1,4) when unset; topk 1 forces
    # draft tokens = steps + 1; max running requests 48 when unset)
    ns.resolved_warnings = []
    if ns.speculative_algorithm:
        ns.speculative_algorithm = ns.speculative_algorithm.upper().replace("NEXTN", "EAGLE")
        if ns.speculative_num_steps is None:
            ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens = 3, 1, 4
        if ns.speculative_eagle_topk == 1 and ns.speculative_num_draft_tokens != ns.speculative_num_steps + 1:
            ns.speculative_num_draft_tokens = ns.speculative_num_steps + 1
            ns.resolved_warnings.append(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
            )
        if ns.max_running_requests is None:
            ns.max_running_requests = 48
    if ns.served_model_name is None:
        ns.served_model_name = ns.model_path
    resolve_backends(ns, ns.resolved_warnings)  # what --enable-deterministic-inference changes (attention_hook.py)
    return ns


ARGS = parse()
STEPS = ARGS.speculative_num_steps or 0
STATE = {"generated": 0, "verify": 0, "calls": 0, "inflight": 0}
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
RIDS: set = set()  # rids of unfinished /generate requests
ABORTED: set = set()  # live rids a background abort task hit
DRAWS = itertools.count()  # the server's own RNG for unseeded (or seed-ignoring) sampled requests
# api/v1/api_types.py::_FIELDS_SamplingParams
NATIVE_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)


def effective_seed(seed):
    """sampling/sampling_batch_info.py: the seed is used only with --enable-deterministic-inference (42 if none)."""
    if ARGS.enable_deterministic_inference:
        return 42 if seed is None else seed
    return f"draw{next(DRAWS)}-{os.getpid()}"


def words_for(prompt: str, n: int, seed, temperature: float) -> list[str]:
    key = prompt if temperature == 0 else f"{prompt}|{effective_seed(seed)}"
    if temperature == 0 and str(STEPS) == os.environ.get("RIG_DOUBLE_LOSSY_STEPS"):
        key += "|lossy"
    h = hashlib.sha256(key.encode()).digest()
    return [WORDS[h[i % 32] % len(WORDS)] for i in range(n)]


def authorized(request: web.Request) -> bool:
    return not ARGS.api_key or request.headers.get("Authorization") == f"Bearer {ARGS.api_key}"


def unauthorized() -> web.Response:
    return web.json_response({"error": "Unauthorized"}, status=401)


def oai_error(message: str, err_type: str = "BadRequest") -> web.Response:
    """openai/serving_base.py::create_error_response (a ValueError in the serving code is type BadRequest)."""
    return web.json_response(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": 400}, status=400
    )


async def steps_of(n: int):
    """Yield (tokens so far, verify count): one chunk per verify step, STEPS tokens each (a crude acceptance)."""
    crash_after = os.environ.get("RIG_DOUBLE_CRASH_AFTER")
    STATE["calls"] += 1
    if crash_after and STATE["calls"] > int(crash_after):
        os._exit(9)
    if os.environ.get("RIG_DOUBLE_HANG"):
        await asyncio.sleep(3600)
    delay = float(os.environ.get("RIG_DOUBLE_TOKEN_DELAY", "0.01"))
    done, verify = 0, 0
    STATE["inflight"] += 1
    try:
        while done < n:
            await asyncio.sleep(delay)
            done = min(n, done + max(1, STEPS))
            verify += 1
            yield done, verify
    finally:
        STATE["inflight"] -= 1
        STATE["generated"] += done
        STATE["verify"] += verify


def spec_details(done: int, verify: int) -> dict:
    """openai/protocol.py::SpecTokensDetails from the finished meta_info (openai/utils.py)."""
    accepted = done - verify
    proposed = verify * STEPS
    return {
        "spec_accept_rate": accepted / proposed if proposed else 0.0,
        "spec_accept_length": done / verify,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": accepted,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify,
        "spec_correct_drafts_histogram": [],
        "spec_cap_lens_histogram": [],
    }


async def sse_response(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


def data(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def generate(request: web.Request) -> web.StreamResponse:
    if not authorized(request):
        return unauthorized()
    body = await request.json()
    sp = body.get("sampling_params", {})
    unknown = [k for k in sp if k not in NATIVE_FIELDS]
    if unknown:  # api/v1/api_types.py::_unknown_field; http_server.py::generate_request answers {"error": text}
        listed = ", ".join(f"`{f}`" for f in NATIVE_FIELDS)
        return web.json_response({"error": f"unknown field `{unknown[0]}`, expected one of {listed}"}, status=400)
    n = int(sp.get("max_new_tokens", 128))
    words = words_for(body.get("text", ""), n, sp.get("sampling_seed"), float(sp.get("temperature", 1.0)))
    rid = body.get("rid")
    resp = await sse_response(request)
    if rid is not None and rid in RIDS:  # managers/tokenizer_manager.py: a rid still in rid_to_state; the stream
        # carries the ValueError (http_server.py::stream_results)
        await resp.write(
            data(
                {
                    "error": {
                        "message": f"Duplicate request ID detected: {rid}",
                        "type": "invalid_request_error",
                        "code": 400,
                        "retryable": False,
                    }
                }
            )
        )
        await resp.write(b"data: [DONE]\n\n")
        return resp
    if rid is not None:
        RIDS.add(rid)
    try:
        await _generate_stream(resp, body, n, words)
    finally:
        RIDS.discard(rid)
        ABORTED.discard(rid)
        if rid is not None:  # TokenizerManager.create_abort_task: 2 s after the stream, abort the rid if live
            asyncio.get_running_loop().call_later(2.0, _abort_rid, rid)
    return resp


def _abort_rid(rid: str) -> None:
    """tokenizer_manager.py::abort_request (exact look-up), then scheduler.py::abort_request (rid prefix)."""
    if rid in RIDS:
        ABORTED.update(r for r in RIDS if r.startswith(rid))


async def _generate_stream(resp: web.StreamResponse, body: dict, n: int, words: list[str]) -> None:
    async for done, verify in steps_of(n):
        aborted = body.get("rid") in ABORTED
        # managers/tokenizer_manager.py::_handle_batch_output: the keys of every chunk's meta_info
        meta = {
            "id": body.get("rid"),
            "finish_reason": (
                {"type": "abort", "message": "Aborted"}
                if aborted
                else {"type": "length", "length": n}
                if done == n
                else None
            ),
            "prompt_tokens": len(body.get("text", "").split()),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": done,
            "cached_tokens": 0,
        }
        if done == n and STEPS:
            meta.update(spec_verify_ct=verify, spec_accept_length=done / verify)
        await resp.write(
            data(
                {
                    "text": " ".join(words[:done]),
                    "output_ids": [WORDS.index(w) for w in words[:done]],
                    "meta_info": meta,
                }
            )
        )
        if aborted:
            break
    await resp.write(b"data: [DONE]\n\n")


def _usage(prompt_tokens: int, done: int) -> dict:
    """openai/usage_processor.py: cached tokens only with --enable-cache-report."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": done,
        "total_tokens": prompt_tokens + done,
        "prompt_tokens_details": {"cached_tokens": 0} if ARGS.enable_cache_report else None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


async def openai_route(request: web.Request, chat: bool) -> web.StreamResponse:
    if not authorized(request):
        return unauthorized()
    body = await request.json()
    # openai/serving_chat.py::_convert_to_internal_request
    if chat and body.get("stream") and body.get("return_token_ids"):
        return oai_error(
            "return_token_ids is not supported with streaming on /v1/chat/completions. Please set "
            "stream=false when using return_token_ids=true."
        )
    if chat and not body.get("messages"):  # serving_chat.py::_validate_request
        return oai_error("Messages cannot be empty.", "BadRequestError")
    if not chat and not body.get("prompt"):  # serving_completions.py::_validate_request
        return oai_error("Prompt cannot be empty", "BadRequestError")
    prompt = render(body["messages"]) if chat else body.get("prompt", "")
    n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    words = words_for(prompt, n, body.get("seed"), float(body.get("temperature", 1.0)))
    ids = [WORDS.index(w) for w in words]
    obj = "chat.completion.chunk" if chat else "text_completion"
    head = {"id": "cmpl-double", "object": obj, "created": int(time.time()), "model": body.get("model")}
    opts = body.get("stream_options") or {}
    if not body.get("stream"):
        return web.json_response({"error": "the double streams only"}, status=501)
    resp = await sse_response(request)
    sent = 0
    done, verify = 0, 0
    if chat:
        await resp.write(
            data(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                            "matched_stop": None,
                        }
                    ],
                }
            )
        )
    async for done, verify in steps_of(n):  # noqa: B007 (the last step's verify count is read after the loop)
        text = (" " if sent else "") + " ".join(words[sent:done])
        finish = "length" if done == n else None
        continuous = bool(opts.get("continuous_usage_stats"))  # openai/utils.py::should_include_usage
        if chat:  # openai/sse_utils.py::build_sse_content: reasoning_content always present (null)
            choice = {
                "index": 0,
                "delta": {"reasoning_content": None, "content": text},
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
            extra = {"usage": _usage(len(prompt.split()), done)} if continuous else {}
        else:  # openai/serving_completions.py: finish inline; token_ids = this output's new ids when asked
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = ids[sent:done]
            extra = {
                "usage": {**_usage(len(prompt.split()), done), "prompt_tokens_details": None} if continuous else None
            }
        sent = done
        await resp.write(data({**head, "choices": [choice], **extra}))
    if chat:  # a separate finish chunk whose delta holds only reasoning_content (null)
        await resp.write(
            data(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"reasoning_content": None},
                            "logprobs": None,
                            "finish_reason": "length",
                            "matched_stop": None,
                        }
                    ],
                }
            )
        )
    if body.get("return_spec_tokens_details") and STEPS and verify:
        await resp.write(
            data({**head, "choices": [], "usage": None, "sglext": {"spec_tokens_details": spec_details(done, verify)}})
        )
    if opts.get("include_usage") or ARGS.stream_response_default_include_usage:
        u = {k: v for k, v in _usage(len(prompt.split()), done).items() if v is not None}
        await resp.write(data({**head, "choices": [], "usage": u}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def render(messages: list) -> str:
    return "\n".join(f"<|{m.get('role')}|>\n{m.get('content')}" for m in messages)


async def completions(request: web.Request) -> web.StreamResponse:
    return await openai_route(request, chat=False)


async def chat(request: web.Request) -> web.StreamResponse:
    return await openai_route(request, chat=True)


async def health(request: web.Request) -> web.Response:
    """entrypoints/http_server.py::health_generate: polls once a second for scheduler output (>= 1 s)."""
    await asyncio.sleep(1.0)
    return web.Response(status=200)


async def server_info(request: web.Request) -> web.Response:
    """entrypoints/http_server.py::server_info: resolved args, the scheduler handshake, internal_states[]."""
    if not authorized(request):
        return unauthorized()
    args = {k: v for k, v in vars(ARGS).items() if k != "resolved_warnings"}
    state = {
        **args,
        "effective_max_running_requests_per_dp": ARGS.max_running_requests or 2048,
        "last_gen_throughput": 0.0,
    }
    if STEPS and STATE["verify"]:
        state["avg_spec_accept_length"] = STATE["generated"] / STATE["verify"]
    return web.json_response(
        {
            **args,
            # utils/common.py::build_server_info: the command line as given (secrets in it, as SGLang leaves them)
            "launch_command": " ".join(sys.argv[1:]),
            "max_total_num_tokens": 1000,
            "max_req_input_len": 4091,
            "internal_states": [state],
            "version": "0.5.23-double",
        }
    )


async def models(request: web.Request) -> web.Response:
    if not authorized(request):
        return unauthorized()
    return web.json_response({"object": "list", "data": [{"id": ARGS.served_model_name, "object": "model"}]})


async def metrics(request: web.Request) -> web.Response:
    """observability/metrics_collector.py names (404 without --enable-metrics, like SGLang)."""
    if not ARGS.enable_metrics:
        return web.Response(status=404)
    accept = STATE["generated"] / STATE["verify"] if STEPS and STATE["verify"] else 0.0
    samples = (
        ("sglang:generation_tokens_total", "counter", STATE["generated"]),
        ("sglang:spec_verify_calls_total", "counter", STATE["verify"]),
        ("sglang:num_running_reqs", "gauge", STATE["inflight"]),
        ("sglang:num_queue_reqs", "gauge", 0),
        ("sglang:token_usage", "gauge", 0.0),
        ("sglang:gen_throughput", "gauge", 0.0),
        ("sglang:spec_accept_length", "gauge", accept),
        ("sglang:spec_num_steps", "gauge", STEPS),  # the active tier (real 0.5.17 publishes it, with num_draft_tokens)
        ("sglang:spec_num_draft_tokens", "gauge", ARGS.speculative_num_draft_tokens or 0),
    )
    labels = f'{{model_name="{ARGS.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
    text = "".join(f"# TYPE {n} {t}\n{n}{labels} {v}\n" for n, t, v in samples)
    return web.Response(text=text, content_type="text/plain")


async def flush(request: web.Request) -> web.Response:
    """entrypoints/http_server.py::flush_cache + scheduler_components/flush_wrapper.py."""
    if not authorized(request):
        return unauthorized()
    try:
        timeout = float(request.query.get("timeout", "0"))
    except ValueError:
        timeout = -1.0
    if not timeout >= 0:  # http_server.py::validation_exception_handler: 400, not FastAPI's 422
        return web.json_response(
            {"object": "error", "message": "query.timeout: invalid", "type": "Bad Request", "param": None, "code": 400},
            status=400,
        )
    deadline = time.monotonic() + timeout
    while STATE["inflight"] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if STATE["inflight"]:
        return web.Response(
            status=400, text="Timed out waiting for idle state." if timeout else "Flush cache failed.\n"
        )
    STATE["generated"] = STATE["verify"] = 0  # scheduler metrics_reporter.reset_metrics()
    return web.Response(text="Cache flushed.\n")


def main() -> None:
    if os.environ.get("RIG_DOUBLE_FAIL_START"):
        print("RuntimeError: not enough memory for the KV cache", flush=True)
        sys.exit(3)
    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/model_info", models)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("GET", "/flush_cache", flush)
    app.router.add_route("POST", "/flush_cache", flush)
    # SGLang logs every server argument, its secrets among them (srt/server_args.py: ServerArgs' repr)
    print(
        f"server_args=ServerArgs(model_path={ARGS.model_path!r}, api_key={ARGS.api_key!r}, "
        f"admin_api_key={ARGS.admin_api_key!r}, hub_token={os.environ.get('HUB_TOKEN')!r})",
        flush=True,
    )
    for w in ARGS.resolved_warnings:
        print(w, flush=True)
    print(
        f"max_total_num_tokens=1000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests={ARGS.max_running_requests or 2048}, context_len=4096, available_gpu_mem=1.00 GB",
        flush=True,
    )
    # uvicorn's timeout_keep_alive = SGLANG_TIMEOUT_KEEP_ALIVE (environ.py: 5 s; entrypoints/http_server.py)
    web.run_app(
        app,
        host=ARGS.host,
        port=ARGS.port,
        print=None,
        shutdown_timeout=1.0,
        keepalive_timeout=float(os.environ.get("SGLANG_TIMEOUT_KEEP_ALIVE", "5")),
    )


if __name__ == "__main__":
    main()
