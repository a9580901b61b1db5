"""The sim's launch flags behave like sglang.launch_server's (SGLang's server_args.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from rig.sim.args import DRAFT_TOKENS_WARNING, MAX_RUNNING_WARNING, human_readable_int, resolve

SPEC = ["--speculative-algorithm", "NEXTN"]


def test_draft_tokens_forced_to_steps_plus_one_with_warning():
    a = resolve(
        [
            "--model-path",
            "m",
            *SPEC,
            "--speculative-num-steps",
            "2",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "7",
        ]
    )
    assert a.speculative_num_draft_tokens == 3
    assert DRAFT_TOKENS_WARNING in a.warnings


def test_no_draft_warning_when_consistent():
    a = resolve(
        [
            "--model-path",
            "m",
            *SPEC,
            "--speculative-num-steps",
            "4",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "5",
            "--max-running-requests",
            "30",
        ]
    )
    assert a.warnings == []
    assert a.max_running_requests == 30
    assert a.steps == 4


def test_max_running_defaults_to_48_when_speculating():
    a = resolve(
        [
            "--model-path",
            "m",
            *SPEC,
            "--speculative-num-steps",
            "1",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "2",
        ]
    )
    assert a.max_running_requests == 48
    assert a.warnings == [MAX_RUNNING_WARNING]
    assert resolve(["--model-path", "m"]).max_running_requests is None


def test_nextn_resolves_to_eagle_and_auto_chooses_3_1_4():
    a = resolve(["--model-path", "m", *SPEC])
    assert a.speculative_algorithm == "EAGLE"
    assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens) == (3, 1, 4)


@pytest.mark.parametrize(
    "argv",
    [
        [*SPEC, "--speculative-num-steps", "3"],  # steps without topk
        [*SPEC, "--speculative-eagle-topk", "1"],  # topk without steps
        ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"],  # no algorithm
        ["--speculative-algorithm", "BOGUS"],
        ["--cuda-graph-max-bs", "8"],  # ambiguous in 0.5.23
        ["--served-model-name", "a:b"],
    ],
)
def test_invalid_combinations_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        resolve(["--model-path", "m", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rig.sim: error:") and "\n" not in err


def test_prefix_abbreviations_and_aliases():
    a = resolve(["--model", "m", "--tp", "4", "--context-length", "32k", "--speculative-algo", "nextn"])
    assert (a.model_path, a.tp_size, a.context_length, a.speculative_algorithm) == ("m", 4, 32000, "EAGLE")
    assert resolve(["--model-path", "m", "--tensor-parallel-size", "2"]).tp_size == 2
    assert human_readable_int("128Ki") == 131072


def test_defaults_like_sglang():
    a = resolve(["--model-path", "m"])
    assert (a.host, a.port, a.tp_size, a.stream_interval, a.decode_log_interval) == ("127.0.0.1", 30000, 1, 1, 40)
    assert a.served_model_name == "m" and isinstance(a.random_seed, int)


def test_unknown_flag_exits_2_with_one_line():
    p = subprocess.run(
        [sys.executable, "-m", "rig.sim", "--model-path", "m", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stderr.strip() == "rig.sim: error: unrecognized arguments: --no-such-flag"


# ---- the flag table generated from SGLang 0.5.23's own parser (scripts/sglang_args.py) ----
from rig.sim.args import SGLANG_VERSION, check_argv, load_table  # noqa: E402


def _sample_value(row):
    """A value SGLang's parser would take for this option (its default, first choice, or a typed literal)."""
    if row["choices"]:
        return [str(row["choices"][0])]
    t = row["type"]
    one = {
        "int": "1",
        "float": "0.5",
        "human_readable_int": "2k",
        "loads": "{}",
        "json_list_type": "[]",
        "parse_cuda_graph_config_arg": "{}",
    }.get(t, "x")
    if row["nargs"] in ("+", "*") or isinstance(row["nargs"], int) and row["nargs"] > 1:
        return [one] * (row["nargs"] if isinstance(row["nargs"], int) else 1)
    return [one]


def test_table_is_from_the_pinned_release_and_has_the_qwen35_flags():
    t = load_table()
    assert t["sglang_version"] == SGLANG_VERSION == "0.5.23"
    flags = {f for r in t["arguments"] for f in r["flags"]}
    for f in (
        "--reasoning-parser",
        "--tool-call-parser",
        "--mamba-radix-cache-strategy",
        "--enable-deterministic-inference",
        "--enable-cache-report",
        "--cuda-graph-max-bs-decode",
    ):
        assert f in flags
    assert "--mamba-scheduler-strategy" not in flags and "--cuda-graph-max-bs" not in flags  # gone in 0.5.23
    assert len(t["arguments"]) > 400


# Options SGLang's own validation refuses when given alone (arg_groups/validation_hook.py::check_server_args): each
# needs a companion flag, so the simulator refuses them alone too.
REFUSED_ALONE = {
    "--export-metrics-to-file": "--export-metrics-to-file-dir is required when --export-metrics-to-file is enabled",
    "--enable-quant-communications": "Communications quantization is only used with tp_size != 1",
    "--enable-pdmux": "PD-Multiplexing is not compatible with chunked prefill.",
    "--kv-canary-sweep-interval": "--kv-canary-sweep-interval requires --kv-canary in {log, raise}",
}


def test_every_sglang_option_is_accepted():
    """Each option of the table, alone, with a value SGLang's parser takes: the simulator must not refuse it, unless
    SGLang's validation refuses it alone too (REFUSED_ALONE)."""
    refused = {}
    for row in load_table()["arguments"]:
        if row["dest"] in (
            "speculative_algorithm",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "served_model_name",
            "model_path",
        ):
            continue  # resolution rules of their own (tested above)
        takes_value = row["action"] in ("store", "append") or row["action"].startswith("custom:") and row["nargs"] != 0
        argv = ["--model-path", "m", row["flags"][0], *(_sample_value(row) if takes_value else [])]
        why = check_argv(argv)
        if why is not None:
            refused[row["flags"][0]] = why.split(" (SGLang ")[0]
    assert refused == REFUSED_ALONE


def test_qwen35_node_flags_accepted_and_logged_as_ignored():
    a = resolve(
        [
            "--model-path",
            "m",
            "--reasoning-parser",
            "qwen3",
            "--mamba-radix-cache-strategy",
            "no_buffer",
            "--disable-overlap-schedule",
            "--enable-deterministic-inference",
            "--enable-cache-report",
        ]
    )
    assert a.enable_deterministic_inference and a.enable_cache_report  # modelled
    # the mamba strategy and the overlap schedule change the state-cache ratio (rig/sim/capacity.py)
    assert sorted(a.ignored) == ["--reasoning-parser"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--cuda-graph-max-bs", "8"],
            "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
        ),
        (
            ["--mamba-radix-cache-strategy", "bogus"],
            "argument --mamba-radix-cache-strategy: invalid choice: 'bogus' (choose from 'auto', 'no_buffer', "
            "'extra_buffer', 'extra_buffer_lazy')",
        ),
        (["--mamba-scheduler-strategy", "x"], "unrecognized arguments: --mamba-scheduler-strategy x"),
        (
            ["--context-length", "32kb"],
            "argument --context-length: Invalid integer value: '32kb'. Use a plain integer, "
            "SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive.",
        ),
    ],
)
def test_refusals_read_like_argparse(argv, message):
    """argparse's own messages (prefix matching, choices, unknown options), as SGLang's parser prints them."""
    assert check_argv(["--model-path", "m", *argv]) == message


def test_human_readable_int_is_case_sensitive_like_sglang():
    assert human_readable_int("25.6k") == 25600 and human_readable_int("1Mi") == 2**20
    for bad in ("32K", "1ki", "1.5Ki"):
        with pytest.raises(argparse.ArgumentTypeError):
            human_readable_int(bad)
