"""rig against a strict plain-OpenAI server (tests/doubles/openai_strict.py): what it refuses, how rig says so, and
that rig speaking plain OpenAI measures it (issue 19 items 1-3 and the strict server of item 5)."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestServer
from doubles import openai_strict
from doubles.openai_strict import MODEL, make_app

from rig.config import Timeouts
from rig.contracts import PointColumns
from rig.loadgen.apis import api_for
from rig.loadgen.client import request_fields, stream_request
from rig.loadgen.dialects import OPENAI_FIELDS, OPENAI_STREAM_OPTIONS, Dialect, resolve
from rig.loadgen.drive import PointRun, make_session
from rig.loadgen.plan import GeneratorPlan
from rig.loadgen.refusals import refused_fields
from rig.results import read_requests
from rig.workloads.base import Session, Turn


def greedy_turn(i: int = 0, max_tokens: int = 200) -> Turn:
    return Turn(
        request_id=f"r{i}",
        messages=({"role": "user", "content": f"tell me a story {i}"},),
        max_tokens=max_tokens,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        ignore_eos=True,
        seed=7,
    )


async def _one(api: str, dialect: Dialect, client: str | None = None, usage: bool = True, turn: Turn | None = None):
    server = TestServer(make_app(usage=usage))
    await server.start_server()
    try:
        async with make_session(client) as http:
            url = str(server.make_url("")).rstrip("/")
            return await stream_request(http, url, api_for(api, dialect), turn or greedy_turn(), [], MODEL, Timeouts())
    finally:
        await server.close()


def one(api: str, dialect: Dialect, **kw):
    return asyncio.run(_one(api, dialect, **kw))


def test_the_doubles_field_lists_are_rigs_plain_dialect():
    """Two declarations on purpose (the double is an independent oracle): they must say the same."""
    assert openai_strict.ROUTE_FIELDS == OPENAI_FIELDS
    assert openai_strict.STREAM_OPTIONS == OPENAI_STREAM_OPTIONS


@pytest.mark.parametrize("client", [None, "aiohttp"])
@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_sglang_fields_are_refused_in_one_line_that_names_them_and_the_fix(api, client):
    out = one(api, Dialect("sglang", {}, "user"), client=client)
    assert out.status == "failed" and out.http_status == 400
    # The double names one field per answer, as OpenAI does: the first, alphabetically.
    assert out.error == (
        "HTTP 400: server refused field ignore_eos: it speaks plain OpenAI; run with --dialect "
        "plain (or drop --dialect sglang)"
    ), out.error


@pytest.mark.parametrize("client", [None, "aiohttp"])
@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_plain_requests_succeed_with_the_servers_usage_and_say_they_ended_early(api, client):
    out = one(api, Dialect("plain"), client=client)
    rec = request_fields(greedy_turn(), out)
    assert rec["status"] == "ok", rec["error"]
    eos = openai_strict.EOS_MIN  # the double stops somewhere in [EOS_MIN, EOS_MIN + EOS_SPAN): before 200
    assert eos <= rec["completion_tokens"] < 200 and rec["finish_reason"] == "stop"
    assert rec["completion_tokens_source"] == "usage"
    assert sum(rec["chunk_tokens"]) == rec["completion_tokens"]  # one token per chunk on this server


def test_without_usage_plain_counts_chunks_and_marks_the_estimate_sglang_fails():
    out = one("openai-chat", Dialect("plain"), usage=False)
    rec = request_fields(greedy_turn(), out)
    assert rec["status"] == "ok" and rec["completion_tokens_source"] == "chunks"
    assert rec["completion_tokens"] == sum(rec["chunk_tokens"]) >= openai_strict.EOS_MIN
    # SGLang and vLLM always send usage: a stream without it stays a failure there (nothing is estimated).
    from rig.loadgen.client import Outcome, _no_usage

    o = Outcome(send_mono=0.0, end_mono=1.0, chunk_tokens=[1, 1])
    assert _no_usage(o, api_for("openai-chat", Dialect("sglang"))).status == "failed"
    assert o.error == "server reported no completion token count" and o.state.completion_tokens is None


def test_extra_body_field_refused_names_the_extra_body_option():
    out = one("openai-completions", Dialect("plain", {"repetition_penalty": 1.1}, "engine"))
    assert out.error == "HTTP 400: server refused field repetition_penalty: drop --extra-body repetition_penalty"


# ------------------------------------------------------------------------------------------ refusal shapes
@pytest.mark.parametrize(
    "status, body, fields",
    [
        (
            422,
            "{\"detail\":\"Unexpected fields in the request: {'ignore_eos', 'return_token_ids', "
            "'return_spec_tokens_details'}\"}",
            ["ignore_eos", "return_spec_tokens_details", "return_token_ids"],
        ),
        (
            400,
            '{"error": {"message": "Unrecognized request argument supplied: top_k", "type": "invalid_request_error"}}',
            ["top_k"],
        ),
        (
            400,
            '{"error": {"message": "Unknown parameter: \'stream_options.continuous_usage_stats\'.", '
            '"param": "stream_options.continuous_usage_stats", "code": "unknown_parameter"}}',
            ["stream_options.continuous_usage_stats"],
        ),
        (
            422,
            '{"detail":[{"type":"extra_forbidden","loc":["body","ignore_eos"],"msg":"Extra inputs are not permitted",'
            '"input":true},{"type":"extra_forbidden","loc":["body","min_tokens"],"msg":"x","input":1}]}',
            ["ignore_eos", "min_tokens"],
        ),
        (
            400,
            "{\"object\":\"error\",\"message\":\"[{'type': 'extra_forbidden', 'loc': ('body', 'top_k'), "
            "'msg': 'Extra inputs are not permitted'}]\"}",
            ["top_k"],
        ),
        (400, '{"error": {"message": "context length exceeded"}}', []),
        (500, '{"detail":"Unexpected fields in the request: {\'x\'}"}', []),  # a 5xx is the server's fault
    ],
)
def test_refused_fields_in_every_shape(status, body, fields):
    assert refused_fields(status, body) == fields


def test_the_transformers_serve_refusal_of_issue_19_becomes_one_line():
    from rig.loadgen.refusals import http_error

    body = (
        "{\"detail\":\"Unexpected fields in the request: {'ignore_eos', 'return_token_ids', "
        "'return_spec_tokens_details'}\"}"
    )
    line = http_error(422, body, Dialect("sglang", {}, "probe:/model_info"), "/v1/completions")
    assert line == (
        "HTTP 422: server refused fields ignore_eos, return_spec_tokens_details, return_token_ids: it "
        "speaks plain OpenAI; run with --dialect plain (rig chose sglang by probe:/model_info)"
    )
    assert "\n" not in line


# ------------------------------------------------------------------------------------------ readiness, probes
def test_ready_without_health_through_v1_models_and_identified_as_plain():
    from rig.server.actor import ServerActor
    from rig.server.spec import ServerConfig

    async def go():
        server = TestServer(make_app())
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        actor = ServerActor(ServerConfig(engine="external", url=url, unreachable_timeout_s=2), "/tmp", "x.log")
        try:
            ready = await actor.wait_ready(timeout_s=5)
            desc = await actor.describe()
        finally:
            await actor._session().close()
            await server.close()
        return ready, desc

    ready, desc = asyncio.run(go())
    assert ready.probe == "/v1/models" and ready.ready_after_s < 2
    info = desc.info
    assert info["/v1/models"]["data"][0]["id"] == MODEL
    assert info["/model_info"] == {"http_status": 404} and info["/version"] == {"http_status": 404}
    assert resolve("external", None, {}, info) == Dialect("plain", {}, "default")


# ------------------------------------------------------------------------------------------ one generator's point
INFO = PointColumns(
    run_id="r",
    point="p0",
    engine="external",
    workload="greedy",
    api="openai-completions",
    steps=0,
    server_config="x",
    server_args="{}",
    load_mode="closed",
    concurrency=2,
    rate=None,
    repeat=0,
)


@pytest.mark.parametrize("usage", [True, False])
def test_a_point_counts_early_ends_and_estimates(tmp_path, usage):
    from rig.run.statuses import dialect_flags

    async def go():
        server = TestServer(make_app(usage=usage))
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        sessions = tuple(Session(session_id=f"s{i}", turns=(greedy_turn(i, 30 + 10 * i),)) for i in range(6))
        plan = GeneratorPlan(
            point=INFO, generator=0, url=url, model=MODEL, sessions=sessions, slots=2, dialect=Dialect("plain")
        )
        run = PointRun(plan, tmp_path, "h", clock_offset_s=0.0)
        async with make_session(None) as http:
            summary = await run.run(http, time.perf_counter() + 0.05)
        await server.close()
        return summary

    summary = asyncio.run(go())
    t = read_requests(tmp_path).to_pandas()
    assert summary.records.ok == 6 == len(t)
    early = int((t.completion_tokens < t.max_tokens).sum())
    assert early >= 1 and summary.ended_early == early  # the double's EOS lies in [12, 52): some of 30..80 end early
    assert (t.finish_reason[t.completion_tokens < t.max_tokens] == "stop").all()
    assert summary.tokens_estimated == (0 if usage else 6)
    assert set(t.completion_tokens_source) == {"usage" if usage else "chunks"}
    flags = dialect_flags([summary], 6, Dialect("plain"))
    assert flags["ended_early"].startswith(f"{early} of 6 requests asked for a fixed length")
    assert "cannot send ignore_eos" in flags["ended_early"]
    assert ("tokens_estimated" in flags) == (not usage)


def test_a_server_refusing_v1_models_fails_within_the_unreachable_budget_naming_both_answers():
    from aiohttp import web

    from rig.server.actor import ServerActor, ServerError
    from rig.server.spec import ServerConfig

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)

    async def go():
        app = web.Application()
        app.router.add_get("/v1/models", refuse)
        server = TestServer(app)
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        actor = ServerActor(ServerConfig(engine="external", url=url, unreachable_timeout_s=1), "/tmp", "x.log")
        t0 = time.monotonic()
        try:
            with pytest.raises(ServerError) as err:
                await actor.wait_ready(timeout_s=30)
        finally:
            await actor._session().close()
            await server.close()
        return str(err.value), time.monotonic() - t0

    msg, waited = asyncio.run(go())
    assert waited < 5 and "HTTP 404 from /health, HTTP 401 from /v1/models" in msg and "\n" not in msg
