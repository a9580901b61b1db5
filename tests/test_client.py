"""The streaming client against a fake server: good streams and every kind of bad one give one record each."""

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from rig.loadgen.apis import SGLangNative
from rig.loadgen.client import ClientTimeouts, request_fields, stream_request
from rig.workloads.base import Turn

from fake_server import make_app


def turn(mode: str = "ok", n: int = 6) -> Turn:
    return Turn(request_id=f"r-{mode}", messages=({"role": "user", "content": f"hello MODE:{mode}"},), max_tokens=n)


async def _send(mode: str, n: int = 6, timeouts: ClientTimeouts = ClientTimeouts()):
    server = TestServer(make_app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            url = str(server.make_url("")).rstrip("/")
            return await stream_request(http, url, SGLangNative(), turn(mode, n), [], "m", timeouts)
    finally:
        await server.close()


def send(mode: str, **kw):
    return asyncio.run(_send(mode, **kw))


def test_ok_stream_counts_tokens_from_server():
    out = send("ok", n=6)
    rec = request_fields(turn(), out)
    assert rec["status"] == "ok" and rec["ok"]
    # chunks alternate 1 and 2 tokens: 1+2+1+2+1+2 = 9 tokens as the server counted them
    assert rec["chunk_tokens"] == [1, 2, 1, 2, 1, 2]
    assert rec["completion_tokens"] == 9 == sum(rec["chunk_tokens"])
    assert rec["finish_reason"] == "length"
    assert rec["spec_verify_ct"] == 6 and rec["spec_accept_length"] == pytest.approx(1.5)
    assert 0 < rec["ttft_s"] <= rec["e2e_s"]
    assert rec["chunk_offsets_s"] == sorted(rec["chunk_offsets_s"]) and rec["chunk_offsets_s"][0] == rec["ttft_s"]
    assert rec["output_hash"] and rec["output_chars"] == len(" tok" * 9)


@pytest.mark.parametrize("mode,status,needle", [
    ("http500", 500, "HTTP 500: "),
    ("http400", 400, "HTTP 400: "),
    ("json", 200, "wrong content type"),
    ("truncate", 200, "truncated stream: ended mid-event"),
    ("malformed", 200, "malformed event"),
    ("error_event", 200, "scheduler crashed"),
    ("nodone", 200, None),
])
def test_faults_become_failed_records(mode, status, needle):
    out = send(mode)
    rec = request_fields(turn(mode), out)
    assert rec["http_status"] == status
    if needle is None:  # a stream that finished but had no [DONE] is still complete
        assert rec["status"] == "ok"
    else:
        assert rec["status"] == "failed" and not rec["ok"] and needle in rec["error"]
        assert rec["output_hash"] is None


def test_first_token_timeout():
    out = send("slowfirst", timeouts=ClientTimeouts(first_token_s=0.3, total_s=5))
    assert out.status == "failed" and "no first token" in out.error and out.end_mono - out.send_mono < 2


def test_connect_refused_is_a_failed_record():
    async def go():
        async with aiohttp.ClientSession() as http:
            return await stream_request(http, "http://127.0.0.1:9", SGLangNative(), turn(), [], "m", ClientTimeouts())
    out = asyncio.run(go())
    assert out.status == "failed" and out.error.startswith("connect")


def test_server_that_never_sends_headers_times_out_on_first_token():
    out = send("hang", timeouts=ClientTimeouts(first_token_s=0.3, total_s=5))
    assert out.status == "failed" and out.error == "timeout: no first token within 0.3s"
    assert out.end_mono - out.send_mono < 2


def test_total_timeout_after_the_first_token():
    out = send("ok", n=400, timeouts=ClientTimeouts(first_token_s=5, total_s=0.3))
    assert out.status == "failed" and out.error == "timeout: stream not finished within 0.3s"
    assert out.first_mono is not None and len(out.chunk_tokens) > 0
