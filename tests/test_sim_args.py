"""The sim's launch flags behave like sglang.launch_server's (sglang-contract.md §1.1-1.2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rig.sim.args import DRAFT_TOKENS_WARNING, MAX_RUNNING_WARNING, human_readable_int, resolve

SPEC = ["--speculative-algorithm", "NEXTN"]


def test_draft_tokens_forced_to_steps_plus_one_with_warning():
    a = resolve(["--model-path", "m", *SPEC, "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "7"])
    assert a.speculative_num_draft_tokens == 3
    assert DRAFT_TOKENS_WARNING in a.warnings


def test_no_draft_warning_when_consistent():
    a = resolve(["--model-path", "m", *SPEC, "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "5", "--max-running-requests", "30"])
    assert a.warnings == []
    assert a.max_running_requests == 30
    assert a.steps == 4


def test_max_running_defaults_to_48_when_speculating():
    a = resolve(["--model-path", "m", *SPEC, "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "2"])
    assert a.max_running_requests == 48
    assert a.warnings == [MAX_RUNNING_WARNING]
    assert resolve(["--model-path", "m"]).max_running_requests is None


def test_nextn_resolves_to_eagle_and_auto_chooses_3_1_4():
    a = resolve(["--model-path", "m", *SPEC])
    assert a.speculative_algorithm == "EAGLE"
    assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens) == (3, 1, 4)


@pytest.mark.parametrize("argv", [
    [*SPEC, "--speculative-num-steps", "3"],  # steps without topk
    [*SPEC, "--speculative-eagle-topk", "1"],  # topk without steps
    ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"],  # no algorithm
    ["--speculative-algorithm", "BOGUS"],
    ["--cuda-graph-max-bs", "8"],  # ambiguous in 0.5.23
    ["--served-model-name", "a:b"],
])
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
    p = subprocess.run([sys.executable, "-m", "rig.sim", "--model-path", "m", "--no-such-flag"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == "rig.sim: error: unrecognized arguments: --no-such-flag"
