"""vLLM's speculative schedule by batch size: read and validated with vLLM 0.32.0's own rules, merged into the
speculative config, steps defaulting to the largest K, recorded and labelled (rig/server/spec_schedule.py)."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest
from click.testing import CliRunner

from rig.cli import cli
from rig.cli_options import resolve_spec, run_options
from rig.config import SpecError, build_spec
from rig.server import spec_schedule as sched
from rig.server.effective import effective_config
from rig.server.engines import VLLMAdapter
from rig.server.spec import ServerConfig

VLLM = {"engine": "vllm", "model": "m", "spec_method": "ngram"}
# vLLM 0.32.0's engine config line (v1/engine/core.py:133, SpeculativeConfig.__repr__ in config/speculative.py:2004)
ENGINE_LINE = (
    "(EngineCore pid=16631) INFO 12-02 15:02:36 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
    "model='/m', speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=3), tokenizer='/m'\n"
    "(EngineCore pid=5576) INFO 11-29 18:08:03 [core.py:402] init engine (profile, create kv cache, warmup model) "
    "took 32.73 s\n"
)


@pytest.mark.parametrize(
    "written",
    [
        "[[1,1,3],[2,64,1]]",
        "1-1:3,2-64:1",
        " 2-64:1 , 1-1:3 ",  # vLLM sorts by start before it checks
        [[1, 1, 3], [2, 64, 1]],
        {"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 64, 1]]},
    ],
)
def test_every_written_form_reads_as_vllms_list(written):
    assert sched.parse(written) == ((1, 1, 3), (2, 64, 1))


def test_a_file_holds_the_list_or_a_speculative_config(tmp_path):
    plain = tmp_path / "s.json"
    plain.write_text("[[1, 2, 4], [3, 64, 0]]")
    config = tmp_path / "s.yaml"
    config.write_text("method: ngram\nnum_speculative_tokens_per_batch_size:\n  - [1, 2, 4]\n  - [3, 64, 0]\n")
    assert sched.parse(str(plain)) == sched.parse(str(config)) == ((1, 2, 4), (3, 64, 0))


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("[]", "non-empty list"),
        ("[[1,2]]", "three integers"),
        ("[[1,2,true]]", "three integers"),
        ("[[1,2.5,3]]", "three integers"),
        ("[[0,2,3]]", "must be positive"),
        ("[[3,2,1]]", "start must be <= end"),
        ("[[1,2,-1]]", "K must be >= 0"),
        ("1-4:2,4-8:1", "overlap"),
        ("2-8:1", "must start at 1"),
        ("[[1,2,3]", "not JSON"),
        ("fast please", "neither a schedule nor a file"),
        ({"schedule": []}, "needs the key num_speculative_tokens_per_batch_size"),
    ],
)
def test_what_vllm_refuses_is_refused_in_one_line(written, says):
    with pytest.raises(ValueError, match=says) as e:
        sched.parse(written)
    assert "\n" not in str(e.value)


def test_k_by_batch_size_follows_vllms_dense_lookup():
    # build_dynamic_sd_schedule_lookup's own example: [(1, 16, 3), (32, 128, 2)] maps 17-31 to K=3 (the gap carries)
    s = sched.parse([[1, 16, 3], [32, 128, 2]])
    assert [sched.k_for(s, b, steps=5) for b in (1, 16, 17, 31, 32, 128, 500)] == [3, 3, 3, 3, 2, 2, 2]
    assert sched.k_for(s, 1, steps=2) == 2  # every K clamped to num_speculative_tokens


def test_the_schedule_goes_into_vllms_speculative_config():
    cfg = ServerConfig(**VLLM, steps=3, spec_schedule="1-1:3,2-64:1")
    argv = VLLMAdapter().argv(cfg, "127.0.0.1", 8000)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 3
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 64, 1]]
    assert "num_speculative_tokens_per_batch_size" not in " ".join(
        VLLMAdapter().argv(ServerConfig(**VLLM, steps=3), "h", 1)
    )


def test_a_scheduled_configuration_is_labelled_as_one():
    cfg = ServerConfig(**VLLM, steps=3, spec_schedule="1-1:3,2-64:1")
    assert cfg.scheduled and cfg.config_id().startswith("vllm-sched-")
    assert cfg.knobs()["spec_schedule"] == [[1, 1, 3], [2, 64, 1]]
    fixed = ServerConfig(**VLLM, steps=3)
    assert not fixed.scheduled and "spec_schedule" not in fixed.knobs()  # ids from before the knob stay the same
    assert fixed.config_id().startswith("vllm-s3-")


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ({"engine": "sim", "steps": 3}, "engine sim does not take it"),
        ({**VLLM, "steps": 2, "spec_schedule": "1-1:3,2-64:1"}, "K=3 at batch sizes 1-1 but steps is 2"),
        ({**VLLM, "steps": 3, "extra_args": ("--data-parallel-size", "2")}, "turns the schedule off"),
        ({**VLLM, "steps": 3, "extra_args": ("-dp=2",)}, "vllm/config/vllm.py:1058"),
    ],
)
def test_a_schedule_that_would_not_run_as_written_is_refused(server, says):
    with pytest.raises(ValueError, match=says):
        ServerConfig(**{"spec_schedule": "1-1:3,2-64:1", **server})


def test_a_server_you_run_is_labelled_with_the_schedule_it_was_said_to_run():
    spec = build_spec({"server": {"engine": "external", "url": "http://127.0.0.1:9", "spec_schedule": "1-2:4"}}, {})
    (cfg,) = spec.server_configs()
    assert cfg.config_id().startswith("external-sched-") and cfg.knobs()["spec_schedule"] == [[1, 2, 4]]
    assert effective_config(cfg, None, None).requested["spec_schedule"] == "1-2:4"


def test_steps_default_to_the_largest_k_and_given_steps_are_kept():
    spec = build_spec({"server": {**VLLM, "spec_schedule": [[1, 2, 4], [3, 64, 1]]}}, {})
    assert spec.steps == [4] and [c.config_id()[:11] for c in spec.server_configs()] == ["vllm-sched-"]
    spec = build_spec({"server": {**VLLM, "spec_schedule": "1-64:0"}, "steps": [2]}, {})
    assert spec.server_configs()[0].spec_schedule == ((1, 64, 0),)
    # steps 0 beside others: the baseline without speculation runs without the schedule
    spec = build_spec({"server": {**VLLM, "spec_schedule": "1-2:4,3-64:1"}, "steps": [0, 4]}, {})
    assert [(c.steps, c.spec_schedule) for c in spec.server_configs()] == [(0, None), (4, ((1, 2, 4), (3, 64, 1)))]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"server": {**VLLM, "spec_schedule": "1-64:0"}}, "every K is 0"),
        ({"server": {**VLLM, "spec_schedule": "1-64:2"}, "steps": [0]}, "needs steps >= 1"),
    ],
)
def test_a_schedule_without_speculation_is_refused(data, says):
    with pytest.raises(SpecError, match=says):
        build_spec(data, {})


def test_the_flag_takes_the_schedule_and_refuses_a_bad_one_in_one_line():
    seen: dict[str, Any] = {}

    @click.command()
    @run_options
    def probe(**kw: Any) -> None:
        seen["spec"] = resolve_spec(kw, None, None)

    base = ["--engine", "vllm", "--spec-method", "ngram"]
    result = CliRunner().invoke(probe, [*base, "--spec-schedule", "[[1,1,3],[2,64,1]]"])
    assert result.exit_code == 0, result.output
    assert seen["spec"].server.spec_schedule == ((1, 1, 3), (2, 64, 1)) and seen["spec"].steps == [3]
    bad = CliRunner().invoke(cli, ["run", *base, "--spec-schedule", "2-8:1", "--dry-run"])
    assert bad.exit_code == 2 and "must start at 1" in bad.output and "Traceback" not in bad.output


def test_the_manifest_records_the_schedule_requested_and_as_vllm_ran_it():
    cfg = ServerConfig(**VLLM, steps=3, spec_schedule="1-1:3,2-64:1")
    startup = VLLMAdapter().parse_startup_log(ENGINE_LINE)
    assert startup["spec_method"] == "ngram" and startup["num_spec_tokens"] == 3
    eff = effective_config(cfg, None, startup)
    assert eff.requested["spec_schedule"] == eff.effective["spec_schedule"] == "1-1:3,2-64:1"
    assert eff.effective["steps"] == 3 and eff.changed == []
    # under data parallelism vLLM drops the schedule and says so (config/vllm.py:1071): a change, not a silence
    off = VLLMAdapter().parse_startup_log(
        ENGINE_LINE + "WARNING [vllm.py:1066] ... Disabling num_speculative_tokens_per_batch_size and falling back "
        "to static num_speculative_tokens=3.\n"
    )
    eff = effective_config(cfg, None, off)
    assert [(c.knob, c.requested, c.effective) for c in eff.changed] == [("spec_schedule", "1-1:3,2-64:1", "off")]
