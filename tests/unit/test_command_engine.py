"""The command engine: any OpenAI-compatible server from a command template (rig/server/command.py), checked before
anything starts, expanded per server configuration, with the API key masked wherever the command is shown."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.cli import cli
from rig.config import SpecError, build_spec
from rig.run.api_key import read_api_key
from rig.run.errors import RunInputError
from rig.server.actor import ServerActor
from rig.server.command import TemplateError, expand, placeholders
from rig.server.engines import engine_for
from rig.server.spec import ServerConfig

TSERVE = ["transformers", "serve", "{model}", "--continuous-batching", "--host", "{host}", "--port", "{port}"]


def cmd(command, **kw) -> ServerConfig:
    return ServerConfig(engine="command", command=command, **kw)


def test_every_placeholder_is_filled_from_the_configuration_and_the_launch():
    cfg = cmd(
        [
            "srv",
            "-m",
            "{model}",
            "--host={host}",
            "--port",
            "{port}",
            "--tp",
            "{tp}",
            "--spec",
            "{steps}",
            "--draft",
            "{num_draft_tokens}",
            "--name",
            "{served_model_name}",
            "--det",
            "{deterministic}",
        ],
        model="/models/m",
        tp=2,
        steps=3,
        served_model_name="m",
        deterministic=True,
    )
    assert engine_for("command").argv(cfg, "10.0.0.5", 8080) == [
        "srv",
        "-m",
        "/models/m",
        "--host=10.0.0.5",
        "--port",
        "8080",
        "--tp",
        "2",
        "--spec",
        "3",
        "--draft",
        "4",
        "--name",
        "m",
        "--det",
        "true",
    ]
    # num_draft_tokens: the configuration's when set, else steps + 1 (SGLang's chain)
    assert expand(cfg.model_copy(update={"num_draft_tokens": 7}), "h", 1)[11] == "7"


def test_extra_args_go_where_the_template_puts_them_else_at_the_end():
    extra = ("--ctx-size", "4096")
    placed = cmd(["srv", "{extra_args}", "--port", "{port}"], extra_args=extra)
    assert expand(placed, "h", 9) == ["srv", "--ctx-size", "4096", "--port", "9"]
    assert expand(cmd(["srv", "--port", "{port}"], extra_args=extra), "h", 9) == ["srv", "--port", "9", *extra]
    # no extra args: nothing, not an empty arg
    assert expand(cmd(["srv", "{extra_args}", "-p{port}"]), "h", 9) == ["srv", "-p9"]
    with pytest.raises(TemplateError, match="stands alone"):
        expand(cmd(["srv", "--args={extra_args}", "{port}"], extra_args=extra), "h", 9)


def test_literal_braces_for_json_arguments():
    cfg = cmd(
        ["srv", "--port={port}", "--speculative-config", '{{"method": "ngram", "num_speculative_tokens": {steps}}}'],
        steps=2,
    )
    assert expand(cfg, "h", 1)[3] == '{"method": "ngram", "num_speculative_tokens": 2}'


@pytest.mark.parametrize(
    "template, why",
    [
        (["srv", "{modle}"], "unknown placeholder {modle}"),
        (["srv", '{"a": 1}'], "not a placeholder"),  # a JSON argument without doubled braces
        (["srv", "{port:d}"], "not a placeholder"),
        (["srv", "{model.x}"], "not a placeholder"),
        (["srv", "}"], "Single '}'"),
        (["srv", "{served_model_name}", "{port}"], "server.served_model_name is not set"),
        (["srv", "--port", "30000"], "places no {port}"),  # rig would wait for the server on another port
    ],
)
def test_a_template_rig_cannot_fill_is_one_line(template, why):
    with pytest.raises(TemplateError, match=why.replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")) as e:
        expand(cmd(template), "h", 1)
    assert "\n" not in str(e.value)


def test_command_line_string_is_split_as_a_shell_would_and_never_given_to_one():
    cfg = cmd("llama-server -m '{model}' --alias 'a b' ; rm -rf /")
    assert cfg.command == ("llama-server", "-m", "{model}", "--alias", "a b", ";", "rm", "-rf", "/")
    with pytest.raises(ValueError, match="No closing quotation"):
        cmd("srv 'unterminated")


def test_command_belongs_to_the_command_engine_and_the_command_engine_needs_one():
    with pytest.raises(ValueError, match="needs server.command"):
        ServerConfig(engine="command")
    with pytest.raises(ValueError, match="for engine 'command'"):
        ServerConfig(engine="vllm", command=["x"])
    for bad in ("model", "extra_args", "api_key", "not-a-name"):
        with pytest.raises(ValueError):
            cmd(["srv"], command_vars={bad: 1})


def test_config_ids_of_other_engines_do_not_change():
    # the new fields are absent from knobs() when unset, so runs from before the command engine keep their ids
    assert "command" not in ServerConfig(engine="sim").knobs()
    assert ServerConfig(engine="sim", steps=4).config_id() == "sim-s4-01a61f00"


def test_unknown_placeholder_exits_2_before_anything_starts(tmp_path):
    r = CliRunner().invoke(
        cli, ["run", "--engine", "command", "--command", "srv {modle} --port {port}", "--out", str(tmp_path)]
    )
    assert r.exit_code == 2
    assert "unknown placeholder {modle}" in r.output and "Traceback" not in r.output
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_grid_knob_by_name_relaunches_per_value_and_dry_run_prints_each_command():
    r = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--dry-run",
            "--engine",
            "command",
            "--model",
            "/m",
            "--tp",
            "1",
            "--command",
            "llama-server -m {model} --host {host} --port {port} -c {ctx} --draft-max {steps}",
            "--steps",
            "0,2",
            "--grid",
            "ctx=2048,4096",
        ],
    )
    assert r.exit_code == 0, r.output
    lines = r.output.split("# server commands (one launch per configuration)\n")[1].split("\n\n")[0].splitlines()
    commands = sorted(line.split(": ", 1)[1] for line in lines)
    # the embedded default binds loopback and picks the port at run time (the dry run says so, issue 23)
    assert commands == sorted(
        f"llama-server -m /m --host 127.0.0.1 --port 30000 -c {c} --draft-max {s}  "
        f"# rig picks a free port at run time (30000 shown)"
        for c in (2048, 4096)
        for s in (0, 2)
    )
    assert len({line.split(": ")[0] for line in lines}) == 4  # four configurations, four ids


def test_grid_knob_the_template_does_not_place_and_steps_it_ignores_are_refused():
    base = {"server": {"engine": "command", "command": ["srv", "{model}", "--port", "{port}"]}}
    with pytest.raises(SpecError, match=r"does not use \{ctx\}"):
        build_spec(base, {"server_grid": {"ctx": [1, 2]}})
    with pytest.raises(SpecError, match="sweeping steps would launch the same server again"):
        build_spec(base, {"steps": [0, 2]})
    with pytest.raises(SpecError, match="cannot sweep 'ctx'"):  # other engines: only their own knobs
        build_spec({"server": {"engine": "vllm"}}, {"server_grid": {"ctx": [1, 2]}})
    spec = build_spec(base, {"steps": [3]})  # one steps value, not placed: allowed (recorded, not applied)
    assert [c.steps for c in spec.server_configs()] == [3]


def test_gpus_asked_of_ray_are_tp_unless_the_server_runs_on_cpu():
    eng = engine_for("command")
    assert eng.num_gpus(cmd(["srv"], tp=2)) == 2
    assert eng.num_gpus(cmd(["srv"], tp=2, device="cpu")) == 0
    assert eng.launches_process and eng.default_api == "openai-completions"


def test_api_key_is_in_the_launched_command_and_masked_everywhere_it_is_shown(tmp_path):
    cfg = cmd(["srv", "--port", "{port}", "--api-key", "{api_key}", "--auth=Bearer:{api_key}"])
    assert expand(cfg, "h", 1)[-2:] == ["***", "--auth=Bearer:***"]  # dry run, spec checks
    actor = ServerActor(cfg, str(tmp_path), "server.log", api_key="s3cret-key")
    actor.argv = actor.engine.launch_argv(cfg, "127.0.0.1", 5, actor.api_key)  # what start() launches
    assert actor.argv[-2:] == ["s3cret-key", "--auth=Bearer:s3cret-key"]
    public = actor.public_command()  # what the manifest records
    assert public == ["srv", "--port", "5", "--api-key", "***", "--auth=Bearer:***"]
    assert not any("s3cret" in a for a in public)


def test_a_template_that_places_the_key_with_no_key_set_is_refused_before_the_run(monkeypatch):
    spec = build_spec(
        {"server": {"engine": "command", "command": ["srv", "--port", "{port}", "--api-key", "{api_key}"]}}, {}
    )
    monkeypatch.delenv("RIG_API_KEY", raising=False)
    with pytest.raises(RunInputError, match=r"places \{api_key\} but no API key is set"):
        read_api_key(spec)
    monkeypatch.setenv("RIG_API_KEY", "k")
    assert read_api_key(spec) == "k"


def test_placeholders_in_order_of_first_use():
    assert placeholders(["a{port}", "{model}", "{port}{host}"]) == ["port", "model", "host"]
