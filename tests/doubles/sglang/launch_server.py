"""A stand-in for `python -m sglang.launch_server` used by rig's tests (never shipped in the package).

Greedy output is a deterministic function of the prompt, so it is identical at every steps value unless
RIG_DOUBLE_LOSSY_STEPS=N makes it differ at steps N (a deliberately lossy server for the losslessness check).
Other switches: RIG_DOUBLE_CRASH_AFTER=n (exit after n /generate calls), RIG_DOUBLE_HANG=1 (accept, never answer),
RIG_DOUBLE_FAIL_START=1 (exit 3 before becoming healthy), RIG_DOUBLE_TOKEN_DELAY=seconds per chunk (default 0.01).
"""

import argparse
import asyncio
import hashlib
import json
import os
import sys

from aiohttp import web


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-num-steps", type=int, default=0)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--api-key")
    return p.parse_args()


ARGS = parse()
STATE = {"generated": 0, "verify": 0, "calls": 0}
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]


def words_for(prompt: str, n: int, seed: int | None, temperature: float) -> list[str]:
    key = prompt if temperature == 0 else f"{prompt}|{seed}"
    if temperature == 0 and str(ARGS.speculative_num_steps) == os.environ.get("RIG_DOUBLE_LOSSY_STEPS"):
        key += "|lossy"
    h = hashlib.sha256(key.encode()).digest()
    return [WORDS[h[i % 32] % len(WORDS)] for i in range(n)]


async def generate(request: web.Request) -> web.StreamResponse:
    if ARGS.api_key and request.headers.get("Authorization") != f"Bearer {ARGS.api_key}":
        return web.json_response({"error": "Unauthorized"}, status=401)
    STATE["calls"] += 1
    crash_after = os.environ.get("RIG_DOUBLE_CRASH_AFTER")
    if crash_after and STATE["calls"] > int(crash_after):
        os._exit(9)
    if os.environ.get("RIG_DOUBLE_HANG"):
        await asyncio.sleep(3600)
    body = await request.json()
    sp = body.get("sampling_params", {})
    n = int(sp.get("max_new_tokens", 16))
    words = words_for(body.get("text", ""), n, sp.get("sampling_seed"), float(sp.get("temperature", 1.0)))
    step = max(1, ARGS.speculative_num_steps)  # tokens per chunk: a crude stand-in for accepted drafts
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    delay = float(os.environ.get("RIG_DOUBLE_TOKEN_DELAY", "0.01"))
    done, verify = 0, 0
    while done < n:
        await asyncio.sleep(delay)
        done = min(n, done + step)
        verify += 1
        meta = {"id": body.get("rid"), "prompt_tokens": len(body.get("text", "").split()), "completion_tokens": done,
                "cached_tokens": 0, "finish_reason": {"type": "length", "length": n} if done == n else None}
        if done == n and ARGS.speculative_num_steps:
            meta.update(spec_verify_ct=verify, spec_accept_length=done / verify)
        await resp.write(f"data: {json.dumps({'text': ' '.join(words[:done]), 'meta_info': meta})}\n\n".encode())
    STATE["generated"] += n
    STATE["verify"] += verify
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def server_info(request: web.Request) -> web.Response:
    return web.json_response({"model_path": ARGS.model_path, "tp_size": ARGS.tp_size,
                              "speculative_num_steps": ARGS.speculative_num_steps, "max_total_num_tokens": 1000,
                              "max_running_requests": 48, "api_key": ARGS.api_key, "internal_states": [{}]})


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": ARGS.model_path, "object": "model"}]})


async def metrics(request: web.Request) -> web.Response:
    text = (f"# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total {STATE['generated']}\n"
            f"# TYPE sglang:spec_verify_calls_total counter\nsglang:spec_verify_calls_total {STATE['verify']}\n"
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n")
    return web.Response(text=text, content_type="text/plain")


async def flush(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.\n")


def main() -> None:
    if os.environ.get("RIG_DOUBLE_FAIL_START"):
        print("RuntimeError: not enough memory for the KV cache", flush=True)
        sys.exit(3)
    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/model_info", models)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/flush_cache", flush)
    print(f"server_args=ServerArgs(model_path={ARGS.model_path!r}, api_key={ARGS.api_key!r})", flush=True)
    print("max_total_num_tokens=1000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
          "max_running_requests=48, context_len=4096, available_gpu_mem=1.00 GB", flush=True)
    web.run_app(app, host=ARGS.host, port=ARGS.port, print=None, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
