"""The sim applies a model's generation defaults on chat, and deterministic inference costs it the prefix cache, as
SGLang 0.5.23 does (real subprocesses started like sglang.launch_server)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import aiohttp
import pytest
from support import start_sim

pytestmark = pytest.mark.server
PROMPT = "Write a detailed technical essay on how a modern CPU executes instructions, with examples."
LONG = " ".join(f"Section {i}: the pipeline fetches, decodes and retires instruction number {i}." for i in range(300))


def _start(tmp: Path, name: str, model: Path, extra: list[str]) -> tuple[subprocess.Popen, str, Path]:
    return start_sim(tmp, name, str(model), ["--enable-cache-report", "--enable-metrics", *extra])


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    """A local model directory whose generation_config.json recommends top_k 1 (greedy whatever the temperature):
    served with SGLang's default --sampling-defaults model, with 'openai', and with deterministic inference."""
    tmp = tmp_path_factory.mktemp("gen")
    model = tmp / "model"
    model.mkdir()
    (model / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.7, "top_k": 1, "top_p": 0.95, "eos_token_id": [1, 2]})
    )
    started = [
        _start(tmp, "model", model, []),
        _start(tmp, "openai", model, ["--sampling-defaults", "openai"]),
        _start(tmp, "det", model, ["--enable-deterministic-inference"]),
    ]
    yield {name: s[1] for name, s in zip(("model", "openai", "det"), started, strict=False)} | {
        "model_log": started[0][2]
    }
    for proc, _, _ in started:
        proc.terminate()
        proc.wait(timeout=10)


async def _events(url: str, body: dict) -> list:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        text = await r.text()
    return [json.loads(f[6:]) for f in text.split("\n\n") if f.startswith("data: {")]


def _chat_text(url: str, **fields) -> str:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 40,
        "stream": True,
        "ignore_eos": True,
        **fields,
    }
    events = asyncio.run(_events(url + "/v1/chat/completions", body))
    return "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))


def test_chat_fills_omitted_sampling_fields_from_generation_config(sims):
    """configs/model_config.py::get_default_sampling_params + openai/protocol.py
    ChatCompletionRequest.to_sampling_params: an omitted top_k takes the model's 1 (greedy: two identical requests
    agree), an explicit top_k -1 (what rig sends) samples, and --sampling-defaults openai ignores the file."""
    model, openai = sims["model"], sims["openai"]
    assert _chat_text(model) == _chat_text(model)  # top_k 1 from generation_config.json: greedy
    assert _chat_text(model, top_k=-1) != _chat_text(model, top_k=-1)  # sent explicitly: sampled at 0.7
    assert _chat_text(openai) != _chat_text(openai)  # OpenAI defaults: temperature 1, top_k off
    assert (
        "Using default chat sampling params from model generation config: "
        "{'temperature': 0.7, 'top_k': 1, 'top_p': 0.95}" in sims["model_log"].read_text()
    )


def test_completions_do_not_use_generation_config(sims):
    """openai/protocol.py CompletionRequest has its own defaults (temperature 1, top_k -1): no model defaults."""
    url = sims["model"] + "/v1/completions"
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 40, "stream": True, "ignore_eos": True}
    texts = [
        "".join(e["choices"][0]["text"] for e in asyncio.run(_events(url, body)) if e.get("choices")) for _ in range(2)
    ]
    assert texts[0] != texts[1]


def _second_turn(url: str) -> dict:
    """The same long prompt twice; the second one's finished meta_info (server-side times from the sim's model)."""
    body = {"text": LONG, "stream": True, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    asyncio.run(_events(url + "/generate", body))
    return asyncio.run(_events(url + "/generate", body))[-1]["meta_info"]


def test_deterministic_inference_loses_the_prefix_cache(sims):
    """attention_hook.py::handle_deterministic_inference: flashinfer (Blackwell) keeps no radix cache, so a repeated
    prompt is prefilled again: no cached tokens, and a longer prefill in the sim's cost model."""
    warm, det = _second_turn(sims["model"]), _second_turn(sims["det"])
    assert warm["cached_tokens"] > 0.9 * warm["prompt_tokens"]
    assert det["cached_tokens"] == 0 and det["prompt_tokens"] == warm["prompt_tokens"]
    prefill = {name: m["prefill_finished_time"] - m["forward_entry_time"] for name, m in (("warm", warm), ("det", det))}
    print(
        f"prefill of the repeated {warm['prompt_tokens']}-token prompt: cached {prefill['warm'] * 1e3:.1f} ms, "
        f"deterministic {prefill['det'] * 1e3:.1f} ms"
    )
    assert prefill["det"] > prefill["warm"]


def test_duplicate_rid_answered_in_each_route_shape(sims):
    """tokenizer_manager.py's ValueError for a rid still in flight: /generate without streaming answers 400
    {"error": {"message"}} (http_server.py::_create_error_response); the OpenAI routes raise it before their first
    chunk, so 400 ErrorResponse (serving_chat.py / serving_completions.py)."""
    url = sims["model"]
    first = {
        "text": PROMPT,
        "rid": "dup",
        "stream": True,
        "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
    }

    async def go():
        async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=first) as r:
            await r.content.readline()
            out = []
            for path, body in (
                ("/generate", {**first, "stream": False}),
                (
                    "/v1/chat/completions",
                    {"model": "m", "rid": "dup", "stream": True, "messages": [{"role": "user", "content": PROMPT}]},
                ),
            ):
                async with s.post(url + path, json=body) as d:
                    out.append((d.status, await d.json()))
            async for _ in r.content:
                pass
        return out

    (s1, b1), (s2, b2) = asyncio.run(go())
    assert (s1, b1) == (400, {"error": {"message": "Duplicate request ID detected: dup"}})
    assert (s2, b2) == (
        400,
        {
            "object": "error",
            "message": "Duplicate request ID detected: dup",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    )
