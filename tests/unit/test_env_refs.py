"""${NAME} in server settings: read from rig's environment, filled into the launch alone; secrets in plain text
refused when the spec is read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rig.config import build_spec
from rig.run.api_key import read_server_env
from rig.run.errors import RunInputError
from rig.server import env_refs
from rig.server.actor import ServerActor
from rig.server.engines import engine_for
from rig.server.spec import ServerConfig
from rig.spec_yaml import SpecError

CFG = ServerConfig(
    engine="sglang",
    extra_args=("--admin-api-key=${ADMIN_KEY}", "--ssl-keyfile-password", "${TLS_PASS}", "--log-level=info"),
    env={"HF_TOKEN": "${HUB}", "PLAIN": "x-${HUB}-y", "OTHER": "literal"},
)


def test_references_are_read_once_each_and_filled_into_the_launch_only():
    assert env_refs.names([CFG, CFG]) == ["ADMIN_KEY", "TLS_PASS", "HUB"]
    values = env_refs.read([CFG], {"ADMIN_KEY": "a1", "TLS_PASS": "p2", "HUB": "h3", "UNUSED": "u"})
    assert values == {"ADMIN_KEY": "a1", "TLS_PASS": "p2", "HUB": "h3"}  # nothing it was not asked for
    launched = env_refs.expand(CFG, values)
    assert launched.extra_args == ("--admin-api-key=a1", "--ssl-keyfile-password", "p2", "--log-level=info")
    assert launched.env == {"HF_TOKEN": "h3", "PLAIN": "x-h3-y", "OTHER": "literal"}
    assert CFG.extra_args[0] == "--admin-api-key=${ADMIN_KEY}"  # the spec's own copy keeps the reference
    plain = ServerConfig(extra_args=("--log-level=info",))
    assert env_refs.expand(plain, {}) is plain


def test_every_unset_or_empty_variable_is_named_in_one_line():
    with pytest.raises(env_refs.EnvRefError) as e:
        env_refs.read([CFG], {"TLS_PASS": "p2", "HUB": ""})
    msg = str(e.value)
    assert "${ADMIN_KEY}" in msg and "${HUB}" in msg and "TLS_PASS" not in msg and "\n" not in msg
    with pytest.raises(env_refs.EnvRefError, match="ADMIN_KEY"):
        env_refs.expand(CFG, {"TLS_PASS": "p2", "HUB": "h"})  # a launch never keeps a reference unfilled


def test_a_run_reads_them_before_it_starts(monkeypatch):
    spec = build_spec({"server": {"engine": "sglang", "extra_args": ["--admin-api-key=${RIG_T_ADMIN}"]}}, {})
    monkeypatch.delenv("RIG_T_ADMIN", raising=False)
    with pytest.raises(RunInputError, match=r"\$\{RIG_T_ADMIN\}.*export"):
        read_server_env(spec, [])
    monkeypatch.setenv("RIG_T_ADMIN", "s3cret")
    assert read_server_env(spec, []) == {"RIG_T_ADMIN": "s3cret"}


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--admin-api-key", "hunter2"], "--admin-api-key has its value in plain text"),
        (["--ssl-keyfile-password=hunter2"], "--ssl-keyfile-password has its value in plain text"),
        (["--api-key", "hunter2"], "--api-key-env"),
        (["--api-key=${K}"], "--api-key-env"),  # rig must know the key to send it
    ],
)
def test_a_secret_in_plain_text_is_refused_when_the_spec_is_read(args, why):
    with pytest.raises(ValidationError, match=why):
        ServerConfig(extra_args=tuple(args))
    with pytest.raises(ValueError, match=why):
        build_spec({"server": {"extra_args": args}}, {})


def test_the_actor_masks_every_referenced_value(tmp_path):
    values = {"ADMIN_KEY": "adm-41", "HUB": "hub-token-3", "GPUS": "0"}
    actor = ServerActor(CFG, str(tmp_path), "server.log", api_key="k0", env_values=values)
    assert set(actor.secrets) >= {"k0", "adm-41", "hub-token-3"}
    # a value too short to be a secret is not masked everywhere (each "0" of the log); a secret flag's value is
    assert "0" not in actor.secrets
    actor.argv = ["srv", "--admin-api-key=ab", "--note=hub-token-3", "--port", "30000"]
    assert actor.public_command() == ["srv", "--admin-api-key=***", "--note=***", "--port", "30000"]


TEMPLATE = ["srv", "--port", "{port}", "--admin-api-key=${ADMIN_KEY}", "--ssl-keyfile-password", "${TLS_PASS}"]


def test_a_command_template_takes_references_too_filled_at_launch_alone(tmp_path, monkeypatch):
    cfg = ServerConfig(engine="command", command=TEMPLATE, env={"HF_TOKEN": "${HUB}"})
    assert env_refs.names([cfg]) == ["ADMIN_KEY", "TLS_PASS", "HUB"]
    # the dry run and the spec checks show the reference as written (no placeholder, not filled)
    assert cfg.knobs()["command"][3] == "--admin-api-key=${ADMIN_KEY}"
    shown = engine_for("command").argv(cfg, "h", 7)
    assert shown == ["srv", "--port", "7", "--admin-api-key=${ADMIN_KEY}", "--ssl-keyfile-password", "${TLS_PASS}"]
    values = {"ADMIN_KEY": "adm-{x}-41", "TLS_PASS": "p}ass{word", "HUB": "hub-token-3"}  # braces are text there
    actor = ServerActor(cfg, str(tmp_path), "server.log", env_values=values)
    launched = env_refs.expand(cfg, values)
    actor.argv = actor.engine.launch_argv(launched, "127.0.0.1", 5, None)  # what start() launches
    assert actor.argv == ["srv", "--port", "5", "--admin-api-key=adm-{x}-41", "--ssl-keyfile-password", "p}ass{word"]
    assert actor.public_command() == ["srv", "--port", "5", "--admin-api-key=***", "--ssl-keyfile-password", "***"]
    spec = build_spec({"server": {"engine": "command", "command": TEMPLATE}}, {})
    monkeypatch.delenv("TLS_PASS", raising=False)
    monkeypatch.setenv("ADMIN_KEY", "a1")
    with pytest.raises(RunInputError, match=r"\$\{TLS_PASS\}"):  # read before anything starts
        read_server_env(spec, spec.server_configs())


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("srv --port {port} --admin-api-key hunter2", r"--admin-api-key in server.command has its value in plain text"),
        ("srv --port {port} --ssl-keyfile-password=hunter2", "write --ssl-keyfile-password=\\$\\{NAME\\}"),
        ("srv --port {port} --api-key hunter2", r"must be \{api_key\}"),
        ("srv --port {port} --api-key=${K}", r"must be \{api_key\}"),  # rig must know the key to send it
    ],
)
def test_a_secret_in_plain_text_in_a_command_template_is_refused_when_the_spec_is_read(template, why):
    with pytest.raises(ValidationError, match=why):
        ServerConfig(engine="command", command=template)
    with pytest.raises(ValueError, match=why):
        build_spec({"server": {"engine": "command", "command": template}}, {})


def test_a_grid_knob_as_a_secret_flags_value_is_refused():
    base = {"server": {"engine": "command", "command": "srv --port {port} --admin-api-key {adm}"}}
    with pytest.raises(ValueError, match=r"takes \{adm\}, whose value is recorded"):
        build_spec(base, {"server_grid": {"adm": ["hunter2", "hunter3"]}}).server_configs()
    ok = build_spec({"server": {"engine": "command", "command": "srv --port {port} --api-key {api_key}"}}, {})
    assert ok.server.command[-1] == "{api_key}"


@pytest.mark.parametrize(
    "server",
    [
        {"extra_args": ["--admin-api-key=abcdefgh123"]},
        {"extra_args": ["--api-key", "abcdefgh123"]},
        {"engine": "command", "command": "srv --port {port} --admin-api-key=abcdefgh123"},
    ],
)
def test_the_refusal_of_a_plain_secret_does_not_show_it(server):
    """The one-line error shows the refused value, with every secret flag's value masked (it went to terminals and
    CI logs in full: '(got ['--admin-api-key=abcdefgh123'])')."""
    with pytest.raises(SpecError) as e:
        build_spec({"server": server}, {})
    assert "abcdefgh123" not in str(e.value)
