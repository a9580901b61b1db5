"""Dataset workloads: ShareGPT and JSONL readers, timestamps, cycling, and one-line errors naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import DATA

from rig.workloads import WorkloadError, WorkloadSpec, build_sessions, dataset_size


def _spec(path: Path | str, **kw) -> WorkloadSpec:
    return WorkloadSpec(name="dataset", path=str(path), **kw)


def test_sharegpt_first_human_turn_and_reply_hint() -> None:
    path = DATA / "sharegpt_small.json"
    sessions = build_sessions(_spec(path, use_reply_length=True, temperature=0.2), seed=0, n_sessions=10)
    # Entries [1] (empty) and [3] (assistant first) have no prompt and are skipped.
    assert len(sessions) == 3 == dataset_size(_spec(path))
    assert sessions[0].turns[0].messages == ({"role": "user", "content": "What is a prime number?"},)
    assert sessions[1].turns[0].messages == (
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a river in Africa."},
    )
    assert [s.extra["source"] for s in sessions] == [f"{path}: entry [{i}]" for i in (0, 2, 4)]
    # Reply-length hint: the gpt reply's characters / 4.5 ("The Nile." is 9 chars -> 2).
    assert sessions[1].turns[0].max_tokens == 2
    assert sessions[0].turns[0].max_tokens == round(
        len(
            "A prime number is a whole number greater than one whose only divisors are one and itself. "
            "Examples are 2, 3, 5, 7 and 11."
        )
        / 4.5
    )
    t = sessions[0].turns[0]
    assert (t.temperature, t.category, t.ignore_eos) == (0.2, "dataset", False)
    # Without the hint, the fallback applies.
    plain = build_sessions(_spec(path, fallback_max_tokens=77), seed=0, n_sessions=3)
    assert {s.turns[0].max_tokens for s in plain} == {77}


def test_jsonl_trace_timestamps_and_max_tokens() -> None:
    spec = _spec(DATA / "trace_small.jsonl")
    sessions = build_sessions(spec, seed=0, n_sessions=100)
    assert len(sessions) == 5  # blank line skipped; no cycle: the file is the whole trace
    assert [s.arrival_s for s in sessions] == [0.0, 0.5, 0.5, 2.0, 4.0]
    assert [s.turns[0].max_tokens for s in sessions] == [120, 512, 64, 512, 200]
    assert sessions[1].turns[0].messages[0] == {"role": "system", "content": "Answer in French."}
    assert sessions[2].extra["source"].endswith("trace_small.jsonl:4")
    capped = build_sessions(_spec(DATA / "trace_small.jsonl", max_tokens=9), seed=0, n_sessions=1)
    assert capped[0].turns[0].max_tokens == 9
    assert (
        build_sessions(_spec(DATA / "trace_small.jsonl", use_timestamps=False), seed=0, n_sessions=2)[1].arrival_s
        is None
    )


def test_cycle_repeats_the_trace_shifted() -> None:
    sessions = build_sessions(_spec(DATA / "trace_small.jsonl", cycle=True), seed=0, n_sessions=12)
    assert len(sessions) == 12
    # span 4.0 plus one mean gap (4.0 / 4) = period 5.0
    assert [s.arrival_s for s in sessions[5:10]] == [5.0, 5.5, 5.5, 7.0, 9.0]
    assert sessions[5].turns[0].messages == sessions[0].turns[0].messages
    assert sessions[5].turns[0].request_id == "dataset-000005-t0"
    assert sessions[5].turns[0].seed != sessions[0].turns[0].seed


def test_shuffle_is_seeded_and_drops_timestamps() -> None:
    spec = _spec(DATA / "trace_small.jsonl", shuffle=True)
    a = build_sessions(spec, seed=1, n_sessions=5)
    orders = {tuple(s.extra["source"] for s in build_sessions(spec, seed=k, n_sessions=5)) for k in range(6)}
    assert [s.extra["source"] for s in a] == [s.extra["source"] for s in build_sessions(spec, seed=1, n_sessions=5)]
    assert len(orders) > 1
    assert all(s.arrival_s is None for s in a)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


_GOOD = '{"prompt": "hello"}\n'


@pytest.mark.parametrize(
    "lines, where, what",
    [
        (_GOOD + '{"prompt": "unterminated\n', 2, "not valid JSON at column 12: Unterminated string"),
        (_GOOD + _GOOD + '{"max_tokens": 10}\n', 3, "missing 'prompt' (a string) or 'messages'"),
        (_GOOD + '{"prompt": 42}\n', 2, "'prompt' must be a non-empty string (got 42)"),
        (_GOOD + '{"prompt": "  "}\n', 2, "'prompt' must be a non-empty string"),
        (
            _GOOD + '{"prompt": "x", "max_tokens": -5}\n',
            2,
            "'max_tokens' must be an integer from 1 to 1,000,000 (got -5)",
        ),
        (
            _GOOD + '{"prompt": "x", "max_tokens": 2.5}\n',
            2,
            "'max_tokens' must be an integer from 1 to 1,000,000 (got 2.5)",
        ),
        (
            _GOOD + '{"prompt": "x", "max_tokens": true}\n',
            2,
            "'max_tokens' must be an integer from 1 to 1,000,000 (got True)",
        ),
        ("[1, 2]\n", 1, "expected a JSON object, got list"),
        ('{"prompt": "a", "messages": []}\n', 1, "has both 'prompt' and 'messages'"),
        ('{"messages": "hi"}\n', 1, "'messages' must be a non-empty list (got 'hi')"),
        ('{"messages": [{"role": "robot", "content": "x"}]}\n', 1, "messages[0].role must be one of"),
        ('{"messages": [{"role": "user"}]}\n', 1, "messages[0].content must be a string (got None)"),
        ('{"messages": [{"role": "system", "content": "x"}]}\n', 1, "'messages' has no user message"),
        ('{"prompt": "a", "timestamp": -1}\n', 1, "'timestamp' must be a number of seconds >= 0 (got -1)"),
        ('{"prompt": "a", "timestamp": "noon"}\n', 1, "'timestamp' must be a number of seconds >= 0"),
        (
            '{"prompt": "a", "timestamp": 5}\n{"prompt": "b", "timestamp": 3}\n',
            2,
            "timestamp 3 is earlier than the previous entry's 5; sort the file by timestamp",
        ),
        ('{"prompt": "a", "timestamp": 5}\n{"prompt": "b"}\n', 2, "has no 'timestamp' but the first entry does"),
        ('{"prompt": "a"}\n\n{"prompt": "b", "timestamp": 1}\n', 3, "has a 'timestamp' but the first entry does not"),
    ],
)
def test_jsonl_errors_name_file_line_and_problem(tmp_path: Path, lines: str, where: int, what: str) -> None:
    path = _write(tmp_path, "bad.jsonl", lines)
    with pytest.raises(WorkloadError) as e:
        _spec(path)  # the file is read when the spec is validated: a bad file stops a run before it starts
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{where}: {what}")


@pytest.mark.parametrize(
    "doc, what",
    [
        ('{"conversations": []}', "top level must be a JSON list of entries (got dict)"),
        ('[{"conversations": {"from": "human"}}]', "entry [0]: 'conversations' must be a list"),
        (
            '[{"conversations": [{"from": "human", "value": "a"}]}, {"conversations": [{"from": "alien", '
            '"value": "b"}]}]',
            "entry [1]: conversations[0].from must be human, gpt or system (got 'alien')",
        ),
        (
            '[{"conversations": [{"from": "human", "value": 3}]}]',
            "entry [0]: conversations[0] must be an object with a string 'value'",
        ),
        (
            '[{"conversations": []}, {"conversations": [{"from": "gpt", "value": "hi"}]}]',
            "no usable entries (need at least one prompt)",
        ),
        ('[{"prompt": "a"}, {"prompt": ""}]', "entry [1]: 'prompt' must be a non-empty string"),
        ("[]", "no usable entries"),
    ],
)
def test_json_errors_name_file_entry_and_problem(tmp_path: Path, doc: str, what: str) -> None:
    path = _write(tmp_path, "bad.json", doc)
    with pytest.raises(WorkloadError) as e:
        _spec(path)
    assert str(e.value).startswith(f"{path}: {what}") and "\n" not in str(e.value)


def test_json_parse_error_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.json", '[\n  {"conversations": []},\n  {"conversations": [}\n]')
    with pytest.raises(WorkloadError, match=rf"^{path}:3: not valid JSON at column 22: Expecting value"):
        _spec(path)


def test_sharegpt_format_requires_conversations(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.json", json.dumps([{"prompt": "a"}]))
    assert len(build_sessions(_spec(path), seed=0, n_sessions=3)) == 1  # auto: JSONL-style records in a list
    with pytest.raises(WorkloadError, match=r"entry \[0\]: missing 'conversations'"):
        _spec(path, format="sharegpt")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"nope.jsonl: cannot read \(No such file or directory\)"):
        _spec(tmp_path / "nope.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=r"latin1.jsonl: not UTF-8 text"):
        _spec(bad)


def test_file_broken_after_validation_fails_at_build(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.jsonl", _GOOD)
    spec = _spec(path)
    path.write_text(_GOOD + "{oops\n")
    with pytest.raises(WorkloadError, match=rf"^{path}:2: not valid JSON"):
        build_sessions(spec, seed=0, n_sessions=2)


def test_edited_file_is_reread(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.jsonl", _GOOD)
    assert len(build_sessions(_spec(path), seed=0, n_sessions=5)) == 1
    path.write_text(_GOOD + '{"prompt": "second line, longer"}\n')
    assert len(build_sessions(_spec(path), seed=0, n_sessions=5)) == 2
