"""The run options are checked against the spec models: every knob is a flag or deliberately YAML-only, every flag
lands on its field with the field's type, and help texts that quote a default quote the field's."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from support import DATA

from rig.cli import cli
from rig.cli_options import HAND_WRITTEN, SPEC_FLAGS, resolve_spec, run_options, spec_field
from rig.cli_settings import unoptional as _unoptional
from rig.config import RunSpec

TRACE = DATA / "trace_small.jsonl"  # a dataset whose entries carry timestamps

# Knobs set only in YAML (a run spec or a cluster file), each for a reason.
YAML_ONLY = {
    "server.steps": "set per configuration from the run's steps (--steps)",
    "server.eagle_topk": "swept with --grid",
    "server.num_draft_tokens": "swept with --grid",
    "server.env": "a mapping",
    "server.command_vars": "a mapping; swept with --grid NAME=... (engine command)",
    "server.device": "set by cluster files (cpu for vLLM's CPU backend)",
    "server.host": "the node's address as Ray sees it, rarely overridden",
    "server.sim_profile": "a file the sim reads; YAML or --grid",
    "server.health_timeout_s": "model loads; YAML",
    "load.slip_threshold_s": "a validity threshold",
    "load.loop_lag_threshold_s": "a validity threshold",
    "load.timeouts.connect_s": "rarely changed",
    "cluster.address": "cluster file (--cluster)",
    "cluster.server_label": "cluster file (--cluster)",
    "cluster.server_resource": "cluster file (--cluster)",
    "cluster.client_label": "cluster file (--cluster)",
    "cluster.client_resource": "cluster file (--cluster)",
    "cluster.allow_generators_on_server_node": "cluster file (--cluster)",
    "cluster.shared_results": "cluster file (--cluster)",
    "cluster.spool_dir": "cluster file (--cluster)",
    "cluster.results_uri": "cluster file (--cluster)",
    "cluster.placement_timeout_s": "cluster file (--cluster)",
    "cluster.object_store_memory_mb": "cluster file (--cluster)",
    "cluster.num_cpus": "cluster file (--cluster)",
    "cluster.gpu_hour_price": "cluster file (--cluster); rig report/compare --gpu-hour-price override it",
}


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = _unoptional(field.annotation)
        if isinstance(ann, type) and issubclass(ann, BaseModel) and name != "workloads":
            out += _leaf_paths(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_every_spec_knob_is_a_flag_or_yaml_only():
    flagged = [s.path for s in SPEC_FLAGS]
    assert len(flagged) == len(set(flagged)), "two flags set one field"
    leaves = set(_leaf_paths(RunSpec))
    decided = set(flagged) | set(HAND_WRITTEN) | set(YAML_ONLY)
    assert leaves - decided == set(), "new spec fields: add a SpecFlag (rig/cli_options.py) or a YAML_ONLY reason"
    assert decided - leaves == set(), "flags or reasons for fields the spec no longer has"


def _sample(path: str) -> tuple[str | None, Any]:
    """A valid value unlike the default: (text for the command line, value expected in the spec)."""
    field = spec_field(path)
    ann = _unoptional(field.annotation)
    default = field.get_default(call_default_factory=True)
    if ann is bool:
        return None, not default
    if typing.get_origin(ann) is Literal:
        choice = next(c for c in reversed(typing.get_args(ann)) if c != default)
        return choice, choice
    if typing.get_origin(ann) is tuple:
        return "--x", ("--x",)
    if ann is int:
        lo = next((m.ge for m in field.metadata if getattr(m, "ge", None) is not None), 0)
        value = max(lo, 1) + 1 if default is None else default + 1
        return str(value), value
    if ann is float:
        value = 2.5 if default in (None, 2.5) else default * 2 + 0.5
        return str(value), value
    if ann is Path:
        return "/etc/hostname", Path("/etc/hostname")
    return "abc", "abc"


# Values that need company (another flag) or a value the sample would not guess; the rest come from _sample.
_SPECIAL: dict[str, tuple[list[str], str, Any]] = {
    "server.engine": (["--url", "http://127.0.0.1:9"], "external", "external"),
    "server.url": (["--engine", "external"], "http://127.0.0.1:9", "http://127.0.0.1:9"),
    "server.unreachable_timeout_s": (["--engine", "external", "--url", "http://127.0.0.1:9"], "7.5", 7.5),
    "server.spec_algorithm": ([], "eagle", "EAGLE"),
    "server.spec_method": ([], "ngram", "ngram"),
    "server.extra_args": (["--engine", "vllm"], "--x", ("--x",)),
    "server.python": (["--engine", "vllm"], "/usr/bin/python3", "/usr/bin/python3"),
    "server.dialect": (["--api", "openai-chat"], "vllm", "vllm"),  # the sim's native API is SGLang's alone
    "load.mode": (["--rate", "1"], "gamma", "gamma"),
    "load.burstiness": (["--rate", "1", "--mode", "gamma"], "2.5", 2.5),
    "load.trace_speed": (["--mode", "trace", "--dataset", str(TRACE)], "2.5", 2.5),
    "load.grace_s": (["--duration", "5"], "2.5", 2.5),
    "run_id": ([], "run-1", "run-1"),
    "out": ([], "/tmp", Path("/tmp")),  # a directory: --out naming a file is refused (issue 23)
}


@pytest.mark.parametrize("flag", SPEC_FLAGS, ids=lambda s: s.flag)
def test_each_flag_sets_its_field(flag, monkeypatch):
    extra, text, expected = _SPECIAL.get(flag.path) or ([], *_sample(flag.path))
    if flag.path == "api_key_env":
        monkeypatch.setenv("abc", "a key")
    argv = extra + ([flag.flag] if text is None else [f"{flag.flag}={text}"])
    seen: dict[str, Any] = {}

    @click.command()
    @run_options
    def probe(**kw: Any) -> None:
        seen["spec"] = resolve_spec(kw, None, None)

    result = CliRunner().invoke(probe, argv)
    assert result.exit_code == 0, (argv, result.output)
    value: Any = seen["spec"]
    for key in flag.path.split("."):
        value = getattr(value, key)
    assert value == expected, (flag.flag, value, expected)


def test_help_texts_quote_the_fields_defaults():
    quoted = 0
    for s in SPEC_FLAGS:
        m = re.search(r"\(default ([^:;)\s]+)", s.field.description or "")
        if not m:
            continue
        quoted += 1
        default = s.field.get_default(call_default_factory=True)
        said = m.group(1).rstrip("/")
        assert said == str(default) or (isinstance(default, float) and float(said) == default), (s.flag, said, default)
    assert quoted >= 5


@pytest.mark.parametrize("command", ["run", "sweep", "tune"])
def test_commands_take_every_flag_with_its_fields_help(command):
    helps = {opt: p.help for p in cli.commands[command].params for opt in p.opts}
    for s in SPEC_FLAGS:
        expected = s.field.description
        if s.flag.startswith("--no-"):
            expected = f"Do not {expected}"
        assert helps[s.flag] == expected, (command, s.flag)
