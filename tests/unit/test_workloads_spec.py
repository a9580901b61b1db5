"""WorkloadSpec: defaults, one-line errors naming the key, and random specs never crashing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rig.workloads import Dist, WorkloadError, WorkloadSpec, build_sessions


def test_sampling_defaults_depend_on_workload() -> None:
    g = WorkloadSpec(name="greedy")
    r = WorkloadSpec(name="realistic")
    assert (g.temperature, g.top_p, g.top_k, g.ignore_eos) == (0.0, 1.0, -1, True)
    assert (r.temperature, r.top_p, r.top_k, r.ignore_eos) == (0.7, 0.95, -1, False)
    assert WorkloadSpec(name="agentic").temperature == 0.7
    # An explicit value beats the workload's default.
    assert WorkloadSpec(name="greedy", temperature=0.5).temperature == 0.5


def test_dist_shorthands() -> None:
    s = WorkloadSpec(name="realistic", chat_output_tokens=256, chat_prompt_tokens={"median": 300})
    assert s.chat_output_tokens == Dist(median=256, sigma=0, min=256, max=256)
    # A partial mapping keeps the other defaults; so does a dotted key (the CLI's --workload-opt form).
    assert s.chat_prompt_tokens == Dist(median=300, sigma=1.0, min=8, max=4000)
    d = WorkloadSpec(**{"name": "agentic", "think_time_s.median": 0, "think_time_s.min": 0})
    assert d.think_time_s == Dist(median=0, sigma=1.0, min=0, max=60)
    with pytest.raises(WorkloadError, match=r"^workload.think_time_s.mean: unknown option"):
        WorkloadSpec(**{"name": "agentic", "think_time_s.mean": 1})


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({"name": "nope"}, "workload.name: Input should be 'greedy', 'realistic', 'agentic' or 'dataset' (got 'nope')"),
        ({"name": "realistic", "top_p": 1.5}, "workload.top_p: Input should be less than or equal to 1 (got 1.5)"),
        ({"name": "realistic", "top_k": 0}, "workload.top_k: must be -1 (disabled) or >= 1 (got 0)"),
        ({"name": "realistic", "colour": "red"}, "workload.colour: unknown option (got 'red')"),
        (
            {"name": "dataset"},
            "workload: path is required for the dataset workload (a ShareGPT .json or a .jsonl file)",
        ),
        (
            {"name": "realistic", "chat_prompt_tokens": {"median": 5000}},
            "workload.chat_prompt_tokens: median (5000) must lie within [min, max] = [8, 4000]",
        ),
        (
            {"name": "realistic", "chat_output_tokens": {"min": 0, "median": 5}},
            "workload.chat_output_tokens: min must be >= 1 (got 0)",
        ),
        ({"name": "realistic", "temperature": float("nan")}, "workload.temperature: Input should be a finite number"),
        ({"name": "realistic", "code_fraction": 2}, "workload.code_fraction: Input should be less than or equal to 1"),
        ({}, "workload.name: Field required"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(kw: dict, expected: str) -> None:
    with pytest.raises(WorkloadError) as e:
        WorkloadSpec(**kw)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(expected)


def test_model_validate_is_one_line_too() -> None:
    with pytest.raises(WorkloadError, match=r"^workload.top_p: "):
        WorkloadSpec.model_validate({"name": "greedy", "top_p": 0})
    with pytest.raises(WorkloadError, match="expected a mapping"):
        WorkloadSpec.model_validate(["greedy"])


def test_nested_in_a_run_spec_keeps_the_message() -> None:
    """The config module nests WorkloadSpec; our one-line message survives inside its ValidationError."""
    from pydantic import BaseModel, ValidationError

    class Outer(BaseModel):
        workloads: list[WorkloadSpec]

    with pytest.raises(ValidationError) as e:
        Outer.model_validate({"workloads": [{"name": "realistic", "top_p": 7}]})
    assert "workload.top_p: Input should be less than or equal to 1 (got 7)" in e.value.errors()[0]["msg"]


def test_build_sessions_argument_errors() -> None:
    spec = WorkloadSpec(name="greedy")
    for kw in ({"seed": -1, "n_sessions": 2}, {"seed": 0, "n_sessions": -3}, {"seed": 1.5, "n_sessions": 2}):
        with pytest.raises(WorkloadError):
            build_sessions(spec, **kw)  # type: ignore[arg-type]


_KEYS = list(WorkloadSpec.model_fields) + ["bogus"]
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.fixed_dictionaries(
        {},
        optional={
            "median": st.floats(-5, 1e4),
            "sigma": st.floats(-1, 5),
            "min": st.floats(-5, 1e4),
            "max": st.floats(-5, 1e7),
        },
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["greedy", "realistic", "agentic", "dataset", "other"]),
    opts=st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=4),
)
def test_random_specs_valid_or_one_line_error(name: str, opts: dict) -> None:
    try:
        WorkloadSpec(**{"name": name, **opts})
    except WorkloadError as e:
        msg = str(e)
        assert "\n" not in msg
        if name == "dataset" and isinstance(opts.get("path"), str) and opts["path"] and not msg.startswith("workload"):
            assert msg.startswith(f"{opts['path']}:")  # a dataset file's own error names the file (and line)
            return
        assert msg.startswith("workload")
        bad_keys = [k for k in opts] + ["name", ""]
        assert any(msg.startswith(f"workload.{k}") for k in bad_keys if k) or msg.startswith("workload:")


_DIST = st.builds(
    lambda m, s, span: {"median": m, "sigma": s, "min": max(1, m / span), "max": m * span},
    st.integers(1, 3000),
    st.floats(0, 2),
    st.floats(1, 4),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["greedy", "realistic", "agentic"]),
    seed=st.integers(0, 2**32),
    fraction=st.floats(0, 1),
    prompt=_DIST,
    out=_DIST,
    turns=st.integers(1, 6),
)
def test_valid_random_specs_build(name: str, seed: int, fraction: float, prompt: dict, out: dict, turns: int) -> None:
    spec = WorkloadSpec(
        name=name,
        code_fraction=fraction,
        chat_prompt_tokens=prompt,
        code_prompt_tokens=prompt,
        chat_output_tokens=out,
        code_output_tokens=out,
        agent_output_tokens=out,
        agent_turns=turns,
        tool_output_tokens=prompt,
    )
    sessions = build_sessions(spec, seed=seed, n_sessions=3)
    assert len(sessions) == 3
    for s in sessions:
        assert s.turns and all(t.max_tokens >= 1 and t.messages for t in s.turns)
