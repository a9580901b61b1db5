"""Secrets an engine echoes back are masked by name (rig/server/redaction.py), whether or not rig knew their values."""

import json

from rig.server.redaction import mask_argv, redact, scrub_info, secret_values


def test_secret_flags_are_masked_in_both_spellings_and_their_values_found():
    argv = ["--model-path", "m", "--api-key", "k1", "--admin-api-key=k2", "--ssl-keyfile-password", "k3", "--port", "1"]
    assert mask_argv(argv) == [
        "--model-path",
        "m",
        "--api-key",
        "***",
        "--admin-api-key=***",
        "--ssl-keyfile-password",
        "***",
        "--port",
        "1",
    ]
    assert secret_values(argv) == ["k1", "k2", "k3"]
    assert secret_values(["--api-key"]) == []  # a flag without its value is not a secret


def test_server_info_fields_the_launch_command_and_every_ranks_state_are_scrubbed():
    info = {
        "api_key": "k1",
        "admin_api_key": "k2",
        "ssl_keyfile_password": None,  # unset stays unset: a reader can tell there is none
        "launch_command": "--model-path m --admin-api-key k2 --api-key=k1",
        "internal_states": [{"admin_api_key": "k2", "speculative_num_steps": 3}],
        "speculative_num_steps": 3,
    }
    out = scrub_info(info)
    assert out["api_key"] == out["admin_api_key"] == "***" and out["ssl_keyfile_password"] is None
    assert out["launch_command"] == "--model-path m --admin-api-key *** --api-key=***"
    assert out["internal_states"] == [{"admin_api_key": "***", "speculative_num_steps": 3}]
    assert info["api_key"] == "k1"  # a copy: the answer itself is left alone
    assert scrub_info([1, 2]) == [1, 2]


def test_redact_replaces_each_known_secret_everywhere():
    assert redact({"a": ["x k1 y", "k2"], "b": 3}, ["k1", "k2", ""]) == {"a": ["x *** y", "***"], "b": 3}
    assert redact("k1", []) == "k1"


def test_a_secrets_json_and_repr_escaped_forms_are_masked_too():
    secret = "pa\"ss\\wörd'q\t1"
    log = "\n".join(
        [
            f"server_args=ServerArgs(admin_api_key={secret!r}, port=30000)",  # SGLang logs its dataclass repr
            json.dumps({"admin_api_key": secret}),  # a JSON log line (ASCII-escaped)
            json.dumps({"admin_api_key": secret}, ensure_ascii=False),
            json.dumps({"line": f"args: {secret!r}"}),  # a repr inside a JSON document
            f"plain {secret} end",
        ]
    )
    out = redact(log, [secret])
    assert "pa" not in out and "rd" not in out, out
    assert out.splitlines()[0] == "server_args=ServerArgs(admin_api_key='***', port=30000)"
    assert json.loads(out.splitlines()[1]) == {"admin_api_key": "***"}
    assert out.splitlines()[-1] == "plain *** end"
    assert redact({"k": [json.dumps(secret)]}, [secret]) == {"k": ['"***"']}
