"""SGLang 0.5.23's contract, one statement per test, each checked against the simulator AND the test double.

Every test names the SGLang source file (wheel path sglang/srt/...) the behaviour comes from. A twin that is more
forgiving than SGLang turns green tests into failed night runs: these tests hold both twins to the same
statements, with the same request, and compare status codes and body shapes, never timings.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from support import DOUBLES, free_port

pytestmark = pytest.mark.server
PROMPT = "Write a detailed technical essay on how a modern CPU executes instructions, with examples."
# A Qwen3.5 node's flags, including three the simulator does not model (--reasoning-parser, mamba strategy, overlap
# schedule), and a draft-token count SGLang changes (topk 1 forces steps + 1: arg_groups/speculative_hook.py).
# no_buffer needs --disable-overlap-schedule (arg_groups/mamba_hook.py::validate_mamba_no_buffer asserts it).
SPEC_FLAGS = [
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "8",
    "--enable-cache-report",
    "--enable-metrics",
    "--decode-log-interval",
    "1",
    "--reasoning-parser",
    "qwen3",
    "--mamba-radix-cache-strategy",
    "no_buffer",
    "--disable-overlap-schedule",
]
DETERMINISTIC_FLAGS = ["--enable-deterministic-inference"]
IMPLS = ("sim", "double")


def _command(impl: str, flags: list[str], port: int) -> tuple[list[str], dict[str, str]]:
    """The same SGLang flags for both twins; the double is found first on PYTHONPATH as sglang.launch_server."""
    module = "rig.sim" if impl == "sim" else "sglang.launch_server"
    env = dict(os.environ)
    if impl == "double":
        env["PYTHONPATH"] = DOUBLES + os.pathsep + env.get("PYTHONPATH", "")
        env["RIG_DOUBLE_TOKEN_DELAY"] = "0.005"
    argv = [
        sys.executable,
        "-m",
        module,
        "--model-path",
        "Qwen/Qwen3.5-122B-A10B",
        "--tp-size",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--random-seed",
        "7",
        *flags,
    ]
    return argv, env


def _start(tmp: Path, impl: str, name: str, flags: list[str]):
    port = free_port()
    argv, env = _command(impl, flags, port)
    log = tmp / f"{impl}-{name}.log"
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{impl} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except Exception:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{impl} did not become healthy: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module", params=IMPLS)
def twin(request, tmp_path_factory):
    """One implementation with two servers: speculative (+ cache report) and deterministic (no speculation)."""
    impl = request.param
    tmp = tmp_path_factory.mktemp(impl)
    procs = []
    try:
        spec_proc, spec_url = _start(tmp, impl, "spec", SPEC_FLAGS)
        procs.append(spec_proc)
        det_proc, det_url = _start(tmp, impl, "det", DETERMINISTIC_FLAGS)
        procs.append(det_proc)
        yield {"impl": impl, "spec": spec_url, "det": det_url}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def run(coro):
    return asyncio.run(coro)


async def _post(url: str, body: dict) -> tuple[int, list | dict | str]:
    """POST; a 200 event stream comes back as the list of its events (JSON or '[DONE]'), anything else as JSON/text."""
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        text = await r.text()
        if r.status == 200 and r.headers.get("Content-Type", "").startswith("text/event-stream"):
            events = []
            for frame in text.split("\n\n"):
                if frame.startswith("data: "):
                    payload = frame[len("data: ") :]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
            return r.status, events
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def _get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return await r.json()


def _completion(**kw) -> dict:
    return {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        **kw,
    }


def _chat(**kw) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        **kw,
    }


# ---------------------------------------------------------------- launch flags
@pytest.mark.parametrize("impl", IMPLS)
def test_unknown_or_ambiguous_flag_exits_2(impl, tmp_path):
    """srt/server_args.py::prepare_server_args: argparse with prefix matching; --cuda-graph-max-bs is ambiguous in
    0.5.23 (it could be -decode or -prefill) and --mamba-scheduler-strategy no longer exists."""
    for flags, needle in (
        (["--cuda-graph-max-bs", "8"], "ambiguous option: --cuda-graph-max-bs could match"),
        (["--mamba-scheduler-strategy", "auto"], "unrecognized arguments: --mamba-scheduler"),
    ):
        argv, env = _command(impl, flags, free_port())
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert needle in p.stderr


def test_qwen35_flags_accepted_and_topk1_resolution_visible_in_server_info(twin):
    """arg_groups/speculative_hook.py: NEXTN -> EAGLE, topk 1 forces num_draft_tokens = steps + 1, max running
    requests 48 when unset; entrypoints/http_server.py::server_info returns the resolved args plus
    internal_states[] with effective_max_running_requests_per_dp."""
    info = run(_get_json(twin["spec"] + "/server_info"))
    assert info["speculative_algorithm"] == "EAGLE"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
        3,
        1,
        4,
    )
    assert info["max_running_requests"] == 48
    assert info["enable_deterministic_inference"] is False
    assert info["reasoning_parser"] == "qwen3"
    state = info["internal_states"][0]
    assert isinstance(state["effective_max_running_requests_per_dp"], int)
    assert run(_get_json(twin["det"] + "/server_info"))["enable_deterministic_inference"] is True


# ---------------------------------------------------------------- /v1/chat/completions
def test_chat_stream_with_return_token_ids_is_400(twin):
    """entrypoints/openai/serving_chat.py::_convert_to_internal_request raises ValueError, which
    serving_base.py::handle_request turns into 400 ErrorResponse(type='BadRequest')."""
    status, body = run(_post(twin["spec"] + "/v1/chat/completions", _chat(return_token_ids=True)))
    assert status == 400
    assert body == {
        "object": "error",
        "message": "return_token_ids is not supported with streaming on "
        "/v1/chat/completions. Please set stream=false when using return_token_ids=true.",
        "type": "BadRequest",
        "param": None,
        "code": 400,
    }


def test_chat_stream_order_sglext_and_cached_usage(twin):
    """serving_chat.py::_generate_chat_stream: role chunk, content deltas, a separate finish chunk with an empty
    delta, then the sglext chunk (return_spec_tokens_details), the usage chunk (include_usage; cached tokens with
    --enable-cache-report, usage_processor.py), [DONE]."""
    status, events = run(
        _post(
            twin["spec"] + "/v1/chat/completions",
            _chat(return_spec_tokens_details=True, stream_options={"include_usage": True}),
        )
    )
    assert status == 200
    assert events[-1] == "[DONE]"
    first, finish, ext, usage = events[0], events[-4], events[-3], events[-2]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    # openai/sse_utils.py::build_sse_content: StreamDelta keeps reasoning_content (null), omits unset role/content
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "length"
    assert ext["choices"] == [] and set(ext["sglext"]) == {"spec_tokens_details"}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 24
    assert isinstance(usage["usage"]["prompt_tokens_details"]["cached_tokens"], int)
    assert all("token_ids" not in c for e in events[:-1] for c in e["choices"])
    assert all("usage" not in e for e in events[:-3])  # usage on content chunks only with continuous_usage_stats


def test_chat_continuous_usage_counts_tokens_per_chunk(twin):
    """serving_chat.py (continuous_usage_stats): every content chunk carries usage with the running completion
    count, so tokens per chunk are known on chat too (several under speculative decoding)."""
    status, events = run(
        _post(
            twin["spec"] + "/v1/chat/completions",
            _chat(stream_options={"include_usage": True, "continuous_usage_stats": True}),
        )
    )
    assert status == 200
    content = [e for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert counts == sorted(counts) and counts[-1] == 24
    assert max(b - a for a, b in zip([0, *counts], counts, strict=False)) > 1


# ---------------------------------------------------------------- /v1/completions
def test_completions_chunks_carry_token_ids_when_asked(twin):
    """serving_completions.py::_generate_completion_stream: with return_token_ids every chunk carries the new token
    ids of its scheduler output (several per chunk under speculative decoding); they add up to the usage count."""
    status, events = run(
        _post(
            twin["spec"] + "/v1/completions", _completion(return_token_ids=True, stream_options={"include_usage": True})
        )
    )
    assert status == 200
    chunks = [e for e in events[:-1] if e["choices"]]
    per_chunk = [len(c["choices"][0]["token_ids"]) for c in chunks]
    assert sum(per_chunk) == events[-2]["usage"]["completion_tokens"] == 24
    assert max(per_chunk) > 1  # speculative decoding commits several tokens per verify step
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # inline on the last text chunk


def test_completions_without_return_token_ids_has_no_token_ids(twin):
    """protocol.py::CompletionResponseStreamChoice drops token_ids when it is None."""
    status, events = run(_post(twin["spec"] + "/v1/completions", _completion()))
    assert status == 200
    assert all("token_ids" not in c for e in events[:-1] for c in e["choices"])


def test_spec_tokens_details_only_when_asked(twin):
    """openai/protocol.py::SglExt/SpecTokensDetails: a trailing sglext chunk with choices [] only when the request
    sets return_spec_tokens_details (0.5.23); its fields are SpecTokensDetails'."""
    _, plain = run(_post(twin["spec"] + "/v1/completions", _completion()))
    assert not any("sglext" in e for e in plain[:-1])
    _, asked = run(_post(twin["spec"] + "/v1/completions", _completion(return_spec_tokens_details=True)))
    ext = [e for e in asked[:-1] if "sglext" in e]
    assert len(ext) == 1 and ext[0]["choices"] == []
    details = ext[0]["sglext"]["spec_tokens_details"]
    assert set(details) == {
        "spec_accept_rate",
        "spec_accept_length",
        "spec_cap_length",
        "spec_block_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_verify_ct",
        "spec_correct_drafts_histogram",
        "spec_cap_lens_histogram",
    }
    assert details["spec_verify_ct"] > 0 and details["spec_accept_length"] > 1.0


def test_cached_tokens_need_enable_cache_report(twin):
    """openai/usage_processor.py: usage.prompt_tokens_details only with --enable-cache-report (the usage chunk is
    dumped with exclude_none, so without it the key is absent)."""
    _, events = run(_post(twin["det"] + "/v1/completions", _completion(stream_options={"include_usage": True})))
    assert events[-2]["choices"] == [] and "prompt_tokens_details" not in events[-2]["usage"]


# ---------------------------------------------------------------- seeds
def _sampled_text(url: str, seed: int) -> str:
    body = _completion(temperature=0.9, top_p=0.95, seed=seed, max_tokens=30)
    status, events = run(_post(url + "/v1/completions", body))
    assert status == 200
    return "".join(c["text"] for e in events[:-1] for c in e["choices"])


def test_seed_is_ignored_without_deterministic_inference(twin):
    """sampling/sampling_batch_info.py: sampling_seed (OpenAI `seed`) is used only with
    --enable-deterministic-inference; otherwise two requests with one seed draw differently."""
    assert _sampled_text(twin["spec"], 11) != _sampled_text(twin["spec"], 11)


def test_seed_is_honoured_with_deterministic_inference(twin):
    a, b, c = (_sampled_text(twin["det"], s) for s in (11, 11, 12))
    assert a == b and a != c


# ---------------------------------------------------------------- native /generate
def test_native_unknown_sampling_param_is_400(twin):
    """api/v1/api_types.py: SamplingParams rejects unknown keys (max_tokens is the OpenAI name, not SGLang's)."""
    status, body = run(_post(twin["spec"] + "/generate", {"text": PROMPT, "sampling_params": {"max_tokens": 5}}))
    assert status == 400
    # http_server.py::generate_request returns the contract check's text (serde wording) as a plain string
    assert body["error"].startswith("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`, ")
    status, _ = run(
        _post(
            twin["spec"] + "/generate",
            {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 2, "beam_width": 1}},
        )
    )
    assert status == 200  # a key the contract admits (0.5.23) is not refused


def test_native_stream_is_cumulative_with_spec_stats_on_finish(twin):
    """managers/tokenizer_manager.py::_handle_batch_output: cumulative text, meta_info.completion_tokens, and
    spec_verify_ct / spec_accept_length on the finished chunk when speculating."""
    status, events = run(
        _post(
            twin["spec"] + "/generate",
            {
                "text": PROMPT,
                "stream": True,
                "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True},
            },
        )
    )
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(b["text"].startswith(a["text"]) for a, b in zip(chunks, chunks[1:], strict=False))
    for c in chunks:
        assert {
            "id",
            "finish_reason",
            "prompt_tokens",
            "weight_version",
            "num_retractions",
            "reasoning_tokens",
            "completion_tokens",
            "cached_tokens",
        } <= set(c["meta_info"])
    last = chunks[-1]["meta_info"]
    assert last["completion_tokens"] == 20 and last["finish_reason"]["type"] == "length"
    assert last["spec_verify_ct"] > 0 and last["spec_accept_length"] == pytest.approx(20 / last["spec_verify_ct"])


# ---------------------------------------------------------------- /flush_cache and /server_info counters
def test_flush_cache_400_while_pending_unless_timeout(twin):
    """entrypoints/http_server.py::flush_cache and managers/scheduler_components/flush_wrapper.py: without
    ?timeout= a flush with a request pending is refused (400); with timeout=T it waits for idle, then flushes
    and resets the accept-length counters (avg_spec_accept_length disappears from internal_states)."""
    url = twin["spec"]

    async def go():
        async with aiohttp.ClientSession() as s:
            body = {
                "text": PROMPT,
                "stream": True,
                "sampling_params": {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True},
            }
            async with s.post(url + "/generate", json=body) as r:
                await r.content.readline()
                async with s.post(url + "/flush_cache") as f:
                    busy = (f.status, await f.text())
                async with s.post(url + "/flush_cache?timeout=-1") as f:
                    invalid = (f.status, await f.json())
                waiter = asyncio.ensure_future(s.post(url + "/flush_cache?timeout=60"))
                async for _ in r.content:
                    pass
            waited = await waiter
            status = waited.status
            waited.release()
            async with s.get(url + "/server_info") as i:
                after = (await i.json())["internal_states"][0]
        return busy, invalid, status, after

    busy, invalid, waited, after = run(go())
    assert busy == (400, "Flush cache failed.\n")
    # Query(0.0, ge=0.0) fails; http_server.py::validation_exception_handler answers 400 (not FastAPI's 422)
    assert invalid[0] == 400
    assert {k: v for k, v in invalid[1].items() if k != "message"} == {
        "object": "error",
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }
    assert waited == 200
    assert "avg_spec_accept_length" not in after


def test_metric_names(twin):
    """observability/metrics_collector.py (--enable-metrics, else 404 from utils/common.py): every sglang: name
    rig reads (window counters, the server time series) is published, with SGLang's labels."""
    from rig.analysis.server_series import ALL_NAMES
    from rig.server.scrape import parse_metrics

    async def go(url):
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            return r.status, await r.text()

    status, text = run(go(twin["spec"]))
    assert status == 200
    samples = {name: labels for name, labels, _ in parse_metrics(text)}
    for name in (n for n in ALL_NAMES if n.startswith("sglang:")):
        assert name in samples, name
        assert "model_name" in json.loads(samples[name])
    assert run(go(twin["det"]))[0] == 404  # that server runs without --enable-metrics


def test_rig_flushes_with_a_timeout_so_a_pending_request_is_waited_for(twin, tmp_path):
    """rig's server actor flushes like bench_serving (POST /flush_cache?timeout=60): a request still finishing at a
    point boundary delays the flush instead of failing it with 400."""
    from rig.server.actor import ServerActor
    from rig.server.spec import ServerConfig

    actor = ServerActor(ServerConfig(engine="sim" if twin["impl"] == "sim" else "sglang"), str(tmp_path), "log")
    actor.url = twin["spec"]

    async def go():
        async with aiohttp.ClientSession() as s:
            body = {
                "text": PROMPT,
                "stream": True,
                "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
            }
            async with s.post(twin["spec"] + "/generate", json=body) as r:
                await r.content.readline()
                flush = asyncio.ensure_future(actor.flush_cache())
                async for _ in r.content:
                    pass
            result = await flush
        await actor._http.close()
        return result

    assert run(go()).status == 200


def test_health_runs_a_generation_and_takes_at_least_a_second(twin):
    """entrypoints/http_server.py::health_generate serves /health too: it submits a 1-token generation and polls
    once a second for scheduler output, so a healthy answer takes >= 1 s; /health_generate is the same route."""

    async def go():
        async with aiohttp.ClientSession() as s:
            out = []
            for path in ("/health", "/health_generate"):
                t0 = time.monotonic()
                async with s.get(twin["spec"] + path) as r:
                    out.append((r.status, time.monotonic() - t0, await r.text()))
            return out

    for status, took, body in run(go()):
        assert status == 200 and body == "" and took >= 1.0


@pytest.mark.parametrize(
    "route, body, message",
    [
        ("/v1/completions", _completion(prompt=""), "Prompt cannot be empty"),
        ("/v1/chat/completions", _chat(messages=[]), "Messages cannot be empty."),
    ],
)
def test_empty_input_is_400(twin, route, body, message):
    """serving_completions.py / serving_chat.py::_validate_request -> serving_base.py::create_error_response."""
    status, got = run(_post(twin["spec"] + route, body))
    assert status == 400
    assert got == {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


# ---------------------------------------------------------------- round 2 (issue 21)
def test_duplicate_inflight_rid_is_refused_in_the_stream(twin):
    """managers/tokenizer_manager.py (~3833): a rid still in rid_to_state raises ValueError("Duplicate request ID
    detected: <rid>"); http_server.py::stream_results sends it as an error event, then [DONE]. Once the first
    request finished, the rid is free again."""
    url = twin["spec"] + "/generate"
    body = {
        "text": PROMPT,
        "rid": "same-rid",
        "stream": True,
        "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True},
    }

    async def go():
        async with aiohttp.ClientSession() as s, s.post(url, json=body) as first:
            await first.content.readline()  # the first request is in flight
            second = await _post(url, body)
            async for _ in first.content:
                pass
        third = await _post(url, {**body, "sampling_params": {"max_new_tokens": 2}})
        return second, third

    (status, events), (status3, events3) = run(go())
    assert status == 200
    assert events == [
        {
            "error": {
                "message": "Duplicate request ID detected: same-rid",
                "type": "invalid_request_error",
                "code": 400,
                "retryable": False,
            }
        },
        "[DONE]",
    ]
    assert status3 == 200 and events3[-1] == "[DONE]" and "meta_info" in events3[-2]


def test_deterministic_server_info_shows_what_the_flag_changed(twin):
    """attention_hook.py::handle_deterministic_inference (Blackwell: flashinfer, no radix cache) and
    overrides.py::_deterministic_sampling_backend (pytorch); TP 4: custom all-reduce off. /server_info reports the
    resolved fields; the speculative server (no flag) keeps its radix cache."""
    det = run(_get_json(twin["det"] + "/server_info"))
    assert (det["attention_backend"], det["disable_radix_cache"], det["sampling_backend"]) == (
        "flashinfer",
        True,
        "pytorch",
    )
    assert det["disable_custom_all_reduce"] is True
    spec = run(_get_json(twin["spec"] + "/server_info"))
    assert spec["disable_radix_cache"] is False and spec["sampling_backend"] == "flashinfer"


@pytest.mark.parametrize("impl", IMPLS)
def test_mamba_no_buffer_without_disable_overlap_schedule_is_refused(impl):
    """arg_groups/mamba_hook.py::validate_mamba_no_buffer asserts disable_overlap_schedule; the launch fails."""
    argv, env = _command(impl, ["--mamba-radix-cache-strategy", "no_buffer"], free_port())
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True." in p.stderr


def test_idle_keepalive_connection_closed_after_5_s(twin):
    """entrypoints/http_server.py passes timeout_keep_alive=SGLANG_TIMEOUT_KEEP_ALIVE (environ.py: 5) to uvicorn:
    a keep-alive connection idle for 5 s is closed by the server (aiohttp's own default would keep it 75 s)."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(twin["spec"])
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: {u.hostname}\r\n\r\n".encode())
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200")
        time.sleep(3.5)
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(1)  # still open, nothing to read
        s.setblocking(True)
        s.settimeout(5)
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the server ...
        assert time.monotonic() - t0 < 3.0  # ... about 5 s after the response
