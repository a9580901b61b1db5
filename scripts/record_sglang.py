#!/usr/bin/env python3
"""Record a live SGLang server's responses, byte for byte, for rig's conformance tests (stdlib only).

    python3 scripts/record_sglang.py --url http://127.0.0.1:30000 --out DIR [--log server.log] [--label base]
        [--command 'python3 -m sglang.launch_server ...'] [--rid-reuse]

Writes DIR/<label>/: one file per exchange (``NAME.request.json`` with method, path and body; ``NAME.response``
with the status line, headers and the raw body, streamed bodies exactly as they arrived), ``provenance.json``
(SGLang's version from /server_info, the GPU from nvidia-smi, the date, the command) and, from ``--log``, the
startup lines rig parses. ``--rid-reuse`` also records SGLang's background abort of a reused rid (a short
stream, then the same rid again while a longer one runs). Nothing here interprets the responses: the conformance
tests (tests/integration/test_sglang_recorded.py) do.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

PROMPT = "def fibonacci(n):\n    "
KEEP = 96 * 1024  # a body longer than twice this keeps its head and tail, the middle elided (the size is recorded)
LONG_TOKENS = 6000  # long enough to outlive SGLang's 2 s abort timer at over 2,000 tok/s
STARTUP = re.compile(
    r"max_total_num_tokens|max_running_requests|KV Cache is allocated|Load weight end|fired up|"
    r"speculative|adaptive|context_len|Capture .*CUDA graph end|server_args=",
    re.IGNORECASE,
)


class Recorder:
    def __init__(self, url: str, out: Path) -> None:
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.index: list[dict] = []

    def exchange(
        self,
        name: str,
        method: str,
        path: str,
        body: object = None,
        headers: dict | None = None,
        raw_body: bytes | None = None,
        timeout: float = 300,
    ) -> tuple[int, bytes]:
        """One request; the response's status, headers and body saved as received (chunks in arrival order)."""
        hdrs = dict(headers or {})
        data = raw_body
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        t0 = time.time()
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        chunks, stamps, broken = [], [], None
        while True:
            try:
                piece = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            except http.client.IncompleteRead as e:  # the server closed a chunked body mid-way: that is the truth
                piece, broken = e.partial, f"IncompleteRead after {sum(map(len, chunks)) + len(e.partial)} bytes"
            if piece:
                chunks.append(piece)
                stamps.append(round(time.time() - t0, 4))
            if not piece or broken:
                break
        conn.close()
        payload = b"".join(chunks)
        req = {"method": method, "path": path, "headers": hdrs, "body": body if raw_body is None else raw_body.decode()}
        (self.out / f"{name}.request.json").write_text(json.dumps(req, indent=1))
        head = f"HTTP/1.1 {resp.status} {resp.reason}\n" + "".join(f"{k}: {v}\n" for k, v in resp.getheaders())
        kept = payload
        if len(payload) > 2 * KEEP:
            kept = payload[:KEEP] + f"\n[... {len(payload) - 2 * KEEP} bytes elided ...]\n".encode() + payload[-KEEP:]
        (self.out / f"{name}.response").write_bytes(head.encode() + b"\n" + kept)
        self.index.append(
            {
                "name": name,
                "status": resp.status,
                "bytes": len(payload),
                "reads": len(chunks),
                "read_offsets_s": stamps[:50],
                "t": t0,
                **({"broken": broken} if broken else {}),
            }
        )
        print(f"record: {name}: {method} {path} -> {resp.status}, {len(payload)} bytes {broken or ''}", flush=True)
        return resp.status, payload

    def save_index(self) -> None:
        (self.out / "index.json").write_text(json.dumps(self.index, indent=1))


def native(text: str, n: int, stream: bool, rid: str | None = None, **sampling: object) -> dict:
    body: dict = {"text": text, "stream": stream, "sampling_params": {"max_new_tokens": n, **sampling}}
    if rid is not None:
        body["rid"] = rid
    return body


def record_routes(r: Recorder, model: str) -> None:
    """The routes and shapes rig reads, and the errors it must parse."""
    for path in (
        "/health",
        "/health_generate",
        "/server_info",
        "/get_server_info",
        "/model_info",
        "/get_model_info",
        "/v1/models",
        "/metrics",
    ):
        r.exchange(path.strip("/").replace("/", "_") + "_idle", "GET", path)
    r.exchange("generate_stream_greedy", "POST", "/generate", native(PROMPT, 64, True, temperature=0.0))
    r.exchange(
        "generate_stream_sampled",
        "POST",
        "/generate",
        native(PROMPT, 64, True, temperature=0.7, top_p=0.95, ignore_eos=True),
    )
    r.exchange("generate_nostream", "POST", "/generate", native(PROMPT, 32, False, temperature=0.0))
    completions = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 48,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r.exchange("completions_stream", "POST", "/v1/completions", completions)
    r.exchange(
        "completions_stream_token_ids",
        "POST",
        "/v1/completions",
        {
            **completions,
            "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    r.exchange("completions_nostream", "POST", "/v1/completions", {**completions, "stream": False})
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a Python function."}],
        "max_completion_tokens": 48,
        "temperature": 0.7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r.exchange("chat_stream", "POST", "/v1/chat/completions", chat)
    r.exchange("metrics_after_load", "GET", "/metrics")
    r.exchange("flush_cache_idle", "POST", "/flush_cache")
    # errors
    r.exchange(
        "err_generate_unknown_sampling_field",
        "POST",
        "/generate",
        native(PROMPT, 8, True, temperature=0.0, not_a_field=1),
    )
    r.exchange("err_generate_no_text", "POST", "/generate", {"sampling_params": {"max_new_tokens": 8}})
    r.exchange("err_generate_too_long_stream", "POST", "/generate", native(PROMPT, 10_000_000, True))
    r.exchange("err_generate_too_long_nostream", "POST", "/generate", native(PROMPT, 10_000_000, False))
    r.exchange("err_completions_bad_type", "POST", "/v1/completions", {**completions, "max_tokens": "many"})
    r.exchange("err_completions_unknown_field", "POST", "/v1/completions", {**completions, "not_a_field": 1})
    r.exchange(
        "err_completions_no_content_type",
        "POST",
        "/v1/completions",
        raw_body=json.dumps(completions).encode(),
        headers={"Content-Type": "text/plain"},
    )
    r.exchange("err_chat_empty_messages", "POST", "/v1/chat/completions", {**chat, "messages": []})
    r.exchange("err_not_found", "GET", "/no_such_route")


def long_completion(model: str, rid: str, max_tokens: int) -> dict:
    """A long streamed completion under a rid of rig's choosing (SGLang's CompletionRequest has ``rid``)."""
    return {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "rid": rid,
    }


def record_busy(r: Recorder, model: str, long_tokens: int) -> None:
    """/flush_cache while a request runs, and a duplicate live rid."""
    long = threading.Thread(
        target=r.exchange,
        args=("busy_long_stream", "POST", "/v1/completions", long_completion(model, "busy-1", long_tokens)),
    )
    long.start()
    time.sleep(1.0)
    r.exchange("flush_cache_busy", "POST", "/flush_cache")
    r.exchange("err_duplicate_live_rid", "POST", "/generate", native(PROMPT, 8, True, rid="busy-1"))
    long.join()


def record_rid_reuse(r: Recorder, model: str, long_tokens: int) -> None:
    """SGLang's background abort: a short stream under rid X, then X (and X0, which X prefixes) again at once."""
    r.exchange("rid_reuse_first", "POST", "/generate", native(PROMPT, 4, True, rid="reuse-t1", ignore_eos=True))
    threads = [
        threading.Thread(
            target=r.exchange,
            args=(f"rid_reuse_{name}", "POST", "/v1/completions", long_completion(model, rid, long_tokens)),
        )
        for name, rid in (("same", "reuse-t1"), ("prefixed", "reuse-t10"), ("other", "other-t1"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def provenance(r: Recorder, command: str | None, label: str) -> None:
    try:
        info = json.loads(r.exchange("server_info_for_provenance", "GET", "/server_info")[1])
    except ValueError:
        info = {}
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = None
    prov = {
        "label": label,
        "sglang_version": info.get("version"),
        "gpu": gpu,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "command": command,
        "recorded_by": "scripts/record_sglang.py",
    }
    (r.out / "provenance.json").write_text(json.dumps(prov, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--label", default="base")
    ap.add_argument("--log", type=Path, help="the server's log, for its startup lines")
    ap.add_argument("--command", help="the launch command, for the provenance")
    ap.add_argument("--rid-reuse", action="store_true")
    ap.add_argument("--model", default="default")
    ap.add_argument(
        "--long-tokens", type=int, default=LONG_TOKENS, help="the long streams' max_tokens (under the context length)"
    )
    a = ap.parse_args(argv)
    r = Recorder(a.url, a.out / a.label)
    provenance(r, a.command, a.label)
    record_routes(r, a.model)
    record_busy(r, a.model, a.long_tokens)
    if a.rid_reuse:
        record_rid_reuse(r, a.model, a.long_tokens)
    r.exchange("metrics_final", "GET", "/metrics")
    r.save_index()
    if a.log and a.log.exists():
        lines = [ln for ln in a.log.read_text(errors="replace").splitlines() if STARTUP.search(ln)]
        (r.out / "startup_lines.txt").write_text("\n".join(ln[:4000] for ln in lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
