"""Request dialects: each body carries only what its server accepts (issue 19 item 1)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.contracts.dialect import probe_paths
from rig.loadgen.apis import api_for
from rig.loadgen.dialects import OPENAI_FIELDS, OPENAI_STREAM_OPTIONS, Dialect, identify, resolve
from rig.server.spec import ServerConfig
from rig.workloads.base import Turn

GREEDY = Turn(
    request_id="r1",
    messages=({"role": "user", "content": "hi"},),
    max_tokens=8,
    temperature=0.0,
    top_p=1.0,
    top_k=20,
    ignore_eos=True,
    seed=5,
)
ROUTES = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions"}
EXTENSIONS = {"ignore_eos", "top_k", "return_token_ids", "return_spec_tokens_details", "min_tokens"}


@pytest.mark.parametrize("api", sorted(ROUTES))
def test_plain_bodies_hold_only_fields_of_openais_reference(api):
    body = api_for(api, Dialect("plain")).payload(GREEDY, [], "m")
    assert set(body) <= OPENAI_FIELDS[ROUTES[api]], set(body) - OPENAI_FIELDS[ROUTES[api]]
    assert body["stream_options"] == {"include_usage": True}  # in the reference; continuous_usage_stats is not
    assert set(body["stream_options"]) <= OPENAI_STREAM_OPTIONS
    assert (body["model"], body["max_tokens"], body["seed"], body["temperature"]) == ("m", 8, 5, 0.0)


def test_the_strict_field_lists_refuse_what_transformers_serve_refused():
    # The fields of the 422 are none of OpenAI's (a list that let them through would prove nothing).
    for route in OPENAI_FIELDS.values():
        assert not route & {"ignore_eos", "return_token_ids", "return_spec_tokens_details", "top_k"}
    assert "continuous_usage_stats" not in OPENAI_STREAM_OPTIONS


def test_sglang_bodies_keep_every_extension_sglang_reads():
    comp = api_for("openai-completions", Dialect("sglang")).payload(GREEDY, [], "m")
    assert comp == {
        "model": "m",
        "temperature": 0.0,
        "top_p": 1.0,
        "stream": True,
        # the running usage: chunk counts where the server has no return_token_ids (0.5.16)
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": True,
        "return_spec_tokens_details": True,
        "top_k": 20,
        "seed": 5,
        "prompt": comp["prompt"],
        "max_tokens": 8,
        "return_token_ids": True,
        # sampling parameters the records state, sent so the server fills none from the model's
        # generation_config.json (issue 21)
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    chat = api_for("openai-chat", Dialect("sglang")).payload(GREEDY, [], "m")
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert chat["ignore_eos"] is True and chat["return_spec_tokens_details"] is True and "return_token_ids" not in chat
    # The default dialect of a bare Api is SGLang's: what the sim and SGLang tests construct directly.
    assert api_for("openai-completions").payload(GREEDY, [], "m") == comp


def test_vllm_bodies_carry_vllms_extensions_but_not_sglangs():
    comp = api_for("openai-completions", Dialect("vllm")).payload(GREEDY, [], "m")
    chat = api_for("openai-chat", Dialect("vllm")).payload(GREEDY, [], "m")
    for body in (comp, chat):
        assert body["ignore_eos"] is True and body["top_k"] == 20
        assert (body["min_p"], body["repetition_penalty"]) == (0.0, 1.0)
        assert "return_spec_tokens_details" not in body
    assert comp["return_token_ids"] is True
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat", "sglang-native"])
def test_extra_body_fields_are_added_last_and_win(api):
    d = Dialect("plain", {"chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.5})
    body = api_for(api, d).payload(GREEDY, [], "m")
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["temperature"] == 0.5


def test_top_k_off_is_sent_as_off_where_the_dialect_has_it_and_no_seed_sends_nothing():
    """top_k off goes out as -1 to SGLang and vLLM (a field left out is filled from the model's generation config,
    issue 21); plain OpenAI has no top_k at all."""
    turn = Turn(request_id="r", messages=({"role": "user", "content": "x"},), max_tokens=4, top_k=-1, seed=None)
    for name in ("plain", "sglang", "vllm"):
        body = api_for("openai-chat", Dialect(name)).payload(turn, [], "m")  # type: ignore[arg-type]
        assert "seed" not in body
        assert body.get("top_k") == (None if name == "plain" else -1)


# ------------------------------------------------------------------------------------------ deciding the dialect
SGLANG_MODEL_INFO = {"model_path": "/m", "tokenizer_path": "/m", "is_generation": True, "served_model_name": "m"}


def test_identify_from_the_probes_answers():
    assert identify({"/model_info": SGLANG_MODEL_INFO}) == ("sglang", "probe:/model_info")
    assert identify({"/model_info": {"http_status": 404}, "/version": {"version": "0.32.0"}}) == (
        "vllm",
        "probe:/version",
    )
    # A /version with more in it is some other server's, and 404s identify nothing.
    assert identify({"/version": {"version": "1", "name": "tgi"}}) is None
    assert identify({"/model_info": {"http_status": 404}, "/version": {"http_status": 404}}) is None


def test_resolve_user_then_engine_then_probe_then_plain():
    info = {"/version": {"version": "0.32.0"}}
    assert resolve("external", "plain", {}, info) == Dialect("plain", {}, "user")
    assert resolve("sim", None, {}, {}) == Dialect("sglang", {}, "engine")
    assert resolve("vllm", None, {}, {}) == Dialect("vllm", {}, "engine")
    assert resolve("external", None, {"a": 1}, info) == Dialect("vllm", {"a": 1}, "probe:/version")
    assert resolve("external", None, {}, {}) == Dialect("plain", {}, "default")
    assert resolve("command", None, {}, {"/model_info": SGLANG_MODEL_INFO}).name == "sglang"  # any foreign engine
    assert probe_paths("external", None) == ("/model_info", "/version", "/server_info")
    assert probe_paths("external", "sglang") == ("/server_info",)
    assert probe_paths("external", "plain") == () and probe_paths("vllm", None) == ()


# ------------------------------------------------------------------------------------------ the options
def test_dialect_and_extra_body_flags_land_in_the_spec_and_leave_config_ids_alone():
    from rig.cli import cli

    base = ServerConfig(engine="external", url="http://127.0.0.1:9")
    assert "dialect" not in base.knobs() and "extra_body" not in base.knobs()  # ids from before stay the same
    res = CliRunner().invoke(
        cli,
        [
            "run",
            "--engine",
            "external",
            "--url",
            "http://127.0.0.1:9",
            "--dialect",
            "plain",
            "--extra-body",
            'chat_template_kwargs={"enable_thinking": false}',
            "--extra-body",
            "mode=fast",
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "dialect: plain" in res.output and "enable_thinking: false" in res.output and "mode: fast" in res.output


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--extra-body", "x={bad"], "not JSON"),
        (["--extra-body", "novalue"], "KEY=JSON"),
        (["--extra-body", "stream=false"], "rig's own field"),
        (["--dialect", "tgi"], "tgi"),
        # a field rig sets itself would win over rig's value while the record keeps rig's: refused, one line
        (["--extra-body", "temperature=0.5"], "--workload-opt temperature="),
        (["--extra-body", "max_completion_tokens=9"], "--workload-opt max_tokens=N"),
        (["--extra-body", "ignore_eos=false"], "'ignore_eos' is rig's own field"),
        (["--extra-body", "seed=3"], "per-request seeds"),
        (["--extra-body", 'stop=["x"]'], "'stop' is rig's own field"),
        (["--extra-body", "n=2"], "one output per request"),
        (["--extra-body", 'stream_options={"include_usage": false}'], "'stream_options' is rig's own field"),
        (["--extra-body", "rid=abc"], "ids of its own"),
        (["--extra-body", "x=NaN"], "x is nan, which JSON cannot carry"),  # orjson would send it as null
        (["--extra-body", 'x={"y": [1, -Infinity]}'], "x.y[1] is -inf"),
    ],
)
def test_bad_dialect_options_are_one_line_exit_2(argv, needle):
    from rig.cli import cli

    res = CliRunner().invoke(cli, ["run", "--engine", "external", "--url", "http://127.0.0.1:9", *argv, "--dry-run"])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output


def test_the_simulated_sglang_behind_an_external_url_is_identified_by_its_model_info():
    """The probe path end to end in-process: the actor describes the server, the lifecycle's resolve reads it."""
    import asyncio

    from aiohttp.test_utils import TestServer

    from rig.server.actor import ServerActor
    from rig.sim.app import create_app
    from rig.sim.launch import build_server, prepare

    async def go():
        srv = build_server(*prepare(["--model-path", "m", "--tp-size", "4", "--skip-server-warmup"]))
        srv.ready = True
        server = TestServer(create_app(srv))
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        actor = ServerActor(ServerConfig(engine="external", url=url), "/tmp", "x.log")
        try:
            ready = await actor.wait_ready(timeout_s=10)
            desc = await actor.describe()
        finally:
            await actor._session().close()
            await server.close()
            await srv.engine.stop()
        return ready, desc.info

    ready, info = asyncio.run(go())
    assert ready.probe == "/health"
    assert resolve("external", None, {}, info) == Dialect("sglang", {}, "probe:/model_info")
    assert resolve("external", "plain", {}, info).source == "user"


def test_an_external_sglang_is_read_for_what_it_runs_and_its_secrets_never_leave_it():
    """A server rig did not launch, identified as SGLang: its /server_info says it runs steps 3 while the points are
    labelled 4 (a warning, and the labels follow the server), and the secrets SGLang echoes back (admin key, TLS key
    password, the launch command) are masked by name although rig never knew them."""
    import asyncio
    import json

    from aiohttp.test_utils import TestServer

    from rig.server.actor import ServerActor
    from rig.server.effective import change_lines, effective_config
    from rig.sim.app import create_app
    from rig.sim.launch import build_server, prepare

    secrets = ["adm1n-s3cret", "tls-pa55word", "us3r-k3y"]
    argv = ["--model-path", "m", "--tp-size", "4", "--skip-server-warmup", "--speculative-algorithm", "EAGLE"]
    argv += ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    argv += ["--admin-api-key", secrets[0], f"--ssl-keyfile-password={secrets[1]}", "--api-key", secrets[2]]

    async def go():
        srv = build_server(*prepare(argv))
        srv.ready = True
        server = TestServer(create_app(srv))
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        actor = ServerActor(ServerConfig(engine="external", url=url, steps=4), "/tmp", "x.log", api_key=secrets[2])
        try:
            await actor.wait_ready(timeout_s=10)
            desc = await actor.describe()
        finally:
            await actor._session().close()
            await server.close()
            await srv.engine.stop()
        return desc

    desc = asyncio.run(go())
    text = json.dumps(desc.model_dump(mode="json"))
    assert not [x for x in secrets if x in text]
    info = desc.info["/server_info"]
    assert info["admin_api_key"] == info["ssl_keyfile_password"] == info["api_key"] == "***"
    assert "--admin-api-key *** --ssl-keyfile-password=*** --api-key ***" in info["launch_command"]
    dialect = resolve("external", None, {}, desc.info)
    assert dialect.name == "sglang"
    cfg = ServerConfig(engine="external", url="http://127.0.0.1:9", steps=4)
    eff = effective_config(cfg, info, desc.startup, dialect.name == "sglang")
    assert eff.effective["steps"] == 3 and eff.seeds_honoured is False
    assert change_lines("c", eff) == ["server c: requested steps=4 but the server runs 3"]
    # without the identification nothing is read into it (a /server_info of another shape means nothing)
    assert effective_config(cfg, info, desc.startup).effective == {}


def test_what_a_dialect_cannot_send_is_said_before_the_points_run():
    from rig.loadgen.dialects import limits
    from rig.workloads.spec import WorkloadSpec

    greedy, realistic = WorkloadSpec(name="greedy"), WorkloadSpec(name="realistic", top_k=40)
    sampling = [(w.name, w.sampling()) for w in (greedy, realistic)]
    lines = limits(Dialect("plain"), sampling)
    assert len(lines) == 2
    assert lines[0].startswith("workload greedy asks for a fixed output length (ignore_eos)")
    assert lines[1].startswith("workload realistic sets top_k=40, which the plain dialect cannot send")
    assert limits(Dialect("vllm"), sampling) == [] == limits(Dialect("sglang"), sampling)


def test_every_field_a_body_of_rigs_carries_is_refused_as_an_extra_field():
    from rig.loadgen.bodies import RIG_FIELDS, TYPED_FIELDS

    assert TYPED_FIELDS <= RIG_FIELDS  # a field added to a body is refused as an extra one too
    for key in RIG_FIELDS:
        with pytest.raises(ValueError, match=f"'{key}' is rig's own field"):
            ServerConfig(extra_body={key: 1})
    assert ServerConfig(extra_body={"chat_template_kwargs": {"enable_thinking": False}}).extra_body


@pytest.mark.parametrize("price", ["nan", "inf", "-inf"])
def test_a_gpu_hour_price_that_is_no_number_is_refused(price):
    from pathlib import Path

    from rig.cli import cli

    golden = str(Path(__file__).parents[1] / "data" / "golden" / "run")
    for argv in (["report", golden], ["compare", golden, golden]):
        res = CliRunner().invoke(cli, [*argv, "--gpu-hour-price", price])
        assert res.exit_code == 2 and "gpu-hour-price" in res.output and "Traceback" not in res.output, res.output
    from rig.cluster_spec import ClusterSpec

    with pytest.raises(ValueError, match="finite"):
        ClusterSpec(gpu_hour_price=float(price))
