"""Workload builders: determinism, prefix stability, length statistics, real code, growing agent sessions."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest
from support import DATA

from rig.workloads import WorkloadSpec, build_sessions, corpus, render_messages, sessions_digest, warmup_sessions
from rig.workloads.lengths import CODE_CHARS_PER_TOKEN, TEXT_CHARS_PER_TOKEN
from rig.workloads.source import read_source, source_tree

SPECS = {
    "greedy": WorkloadSpec(name="greedy"),
    "realistic": WorkloadSpec(name="realistic"),
    "agentic": WorkloadSpec(name="agentic", agent_turns={"max": 8}),
    "dataset": WorkloadSpec(name="dataset", path=str(DATA / "prompts.jsonl"), shuffle=True, cycle=True),
}


def _fields(sessions):  # everything a generator sends, per turn
    return [(s.session_id, s.arrival_s, [dataclasses.astuple(t) for t in s.turns]) for s in sessions]


@pytest.mark.parametrize("name", list(SPECS))
def test_same_seed_same_sessions_and_prefix_stable(name: str) -> None:
    spec = SPECS[name]
    a = build_sessions(spec, seed=7, n_sessions=12)
    b = build_sessions(spec, seed=7, n_sessions=12)
    longer = build_sessions(spec, seed=7, n_sessions=20)
    assert _fields(a) == _fields(b)
    assert sessions_digest(a) == sessions_digest(b)
    assert _fields(longer[:12]) == _fields(a)
    assert sessions_digest(longer[:12]) == sessions_digest(a)
    ids = [t.request_id for s in longer for t in s.turns]
    assert len(ids) == len(set(ids))
    assert longer[3].session_id == f"{name}-000003" and longer[3].turns[0].request_id == f"{name}-000003-t0"


@pytest.mark.parametrize("name", list(SPECS))
def test_different_seed_different_sessions(name: str) -> None:
    a = build_sessions(SPECS[name], seed=1, n_sessions=12)
    b = build_sessions(SPECS[name], seed=2, n_sessions=12)
    assert [t.seed for s in a for t in s.turns] != [t.seed for s in b for t in s.turns]
    assert sessions_digest(a) != sessions_digest(b)
    if name in ("realistic", "agentic"):
        assert [s.turns[0].messages for s in a] != [s.turns[0].messages for s in b]


@pytest.mark.parametrize("name", ["greedy", "realistic", "agentic"])
def test_warmup_sessions_differ_from_measured(name: str) -> None:
    main = build_sessions(SPECS[name], seed=3, n_sessions=5)
    warm = warmup_sessions(SPECS[name], seed=3, n_sessions=5)
    assert all(w.session_id.startswith(f"{name}-warmup-") for w in warm)
    assert {t.seed for s in main for t in s.turns}.isdisjoint({t.seed for s in warm for t in s.turns})


def test_greedy_matches_the_campaign() -> None:
    sessions = build_sessions(SPECS["greedy"], seed=0, n_sessions=128)
    turns = [s.turns[0] for s in sessions]
    assert all(t.temperature == 0 and t.ignore_eos and t.category == "greedy" for t in turns)
    assert len({t.messages[0]["content"] for t in turns}) == 6
    totals = {n: sum(t.max_tokens for t in turns[:n]) for n in (4, 8, 32, 64, 128)}
    # The campaign's Tokens column: 4,000 / 7,441 / 29,798 / 59,000 / 112,000.
    assert totals == {4: 4000, 8: 7500, 32: 29500, 64: 59000, 128: 117500}
    capped = build_sessions(WorkloadSpec(name="greedy", max_tokens=300), seed=0, n_sessions=3)
    assert capped[2].turns[0].max_tokens == 300


def _realistic(n: int, **kw) -> list:
    return build_sessions(WorkloadSpec(name="realistic", **kw), seed=11, n_sessions=n)


def test_realistic_output_lengths_follow_the_distribution() -> None:
    sessions = _realistic(2000, code_fraction=0.0)
    mt = np.array([s.turns[0].max_tokens for s in sessions])
    # Median 250, sigma 0.8 (clipped [16, 2048]); the sample median's SE is ~2% at n=2000.
    assert abs(np.median(mt) / 250 - 1) < 0.08
    assert abs(np.std(np.log(mt)) - 0.8) < 0.06
    assert mt.min() >= 16 and mt.max() <= 2048
    t = sessions[0].turns[0]
    assert (t.temperature, t.top_p, t.top_k, t.ignore_eos) == (0.7, 0.95, -1, False)


def test_realistic_chat_prompt_lengths_follow_the_distribution() -> None:
    sessions = _realistic(1500, code_fraction=0.0, chat_prompt_tokens={"median": 300, "sigma": 0.5})
    est = np.array([len(s.turns[0].messages[0]["content"]) / TEXT_CHARS_PER_TOKEN for s in sessions])
    assert abs(np.median(est) / 300 - 1) < 0.08
    # Prompts longer than a question carry our passages as context.
    assert sum("lighthouse" in s.turns[0].messages[0]["content"] for s in sessions) > 50


def test_realistic_code_prompts_are_real_source_at_the_configured_length() -> None:
    sessions = _realistic(300, code_fraction=1.0, code_prompt_tokens={"median": 500, "sigma": 0.4})
    tree = source_tree()
    for s in sessions[:40]:
        content = s.turns[0].messages[0]["content"]
        path, line = s.extra["source"].rsplit(":", 1)
        code = content.split("\n", 4)[4].rsplit("\n```", 1)[0]  # after instruction, blank, fence, header
        assert len(code) > 200
        assert code in read_source(tree.root, path)
        assert tree.root == os.path.realpath(__import__("sysconfig").get_paths()["stdlib"])
    est = np.array([len(s.turns[0].messages[0]["content"]) / CODE_CHARS_PER_TOKEN for s in sessions])
    assert abs(np.median(est) / 500 - 1) < 0.12
    assert all(s.turns[0].category == "code" for s in sessions)


def test_realistic_mix_fraction() -> None:
    sessions = _realistic(1000, code_fraction=0.3)
    frac = np.mean([s.turns[0].category == "code" for s in sessions])
    assert abs(frac - 0.3) < 0.05  # binomial SE 0.0145


def test_code_dir_option(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(200)))
    sessions = _realistic(5, code_fraction=1.0, code_dir=str(tmp_path))
    assert all(s.extra["source"].startswith("mod.py:") for s in sessions)
    from rig.workloads import WorkloadError

    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match="no source files"):
        _realistic(2, code_fraction=1.0, code_dir=str(tmp_path / "empty"))


def test_agent_sessions_grow_and_think() -> None:
    spec = WorkloadSpec(name="agentic", agent_turns={"median": 6, "sigma": 0.3, "min": 3, "max": 8})
    sessions = build_sessions(spec, seed=5, n_sessions=30)
    system = corpus.agent_text().system_prompt
    tree = source_tree()
    multi = 0
    for s in sessions:
        t0 = s.turns[0]
        assert t0.messages[0] == {"role": "system", "content": system}  # shared by every session: a common prefix
        assert t0.think_time_s == 0.0 and all(t.category == "agent" for t in s.turns)
        sizes = [len(render_messages([m for t in s.turns[: j + 1] for m in t.messages])) for j in range(len(s.turns))]
        assert all(b > a + 100 for a, b in zip(sizes, sizes[1:], strict=False))  # each turn adds a real chunk
        assert all(0 <= t.think_time_s <= 60 for t in s.turns[1:])
        assert [t.request_id for t in s.turns] == [f"{s.session_id}-t{j}" for j in range(len(s.turns))]
        multi += len(s.turns) >= 3
        for t in s.turns[1:]:
            body = t.messages[0]["content"]
            if body.startswith("Tool result for read_file("):
                path = re.match(r"Tool result for read_file\('([^']+)'", body).group(1)
                line = body.split("\n")[1].split("\t", 1)[1]
                assert line in read_source(tree.root, path)  # real source, numbered
    assert multi == len(sessions)
    think = [t.think_time_s for s in sessions for t in s.turns[1:]]
    assert 0.9 < np.median(think) < 2.4  # median 1.5 s, ~150 draws


def test_agent_context_cap() -> None:
    spec = WorkloadSpec(name="agentic", agent_turns=12, tool_output_tokens=1500, agent_max_context_tokens=6000)
    for s in build_sessions(spec, seed=0, n_sessions=8):
        assert 2 <= len(s.turns) < 12
        assert s.extra["est_context_tokens"] <= 6000 * 1.1


def test_heuristic_matches_word_split_of_our_text() -> None:
    """TEXT_CHARS_PER_TOKEN = chars per word / (4/3 tokens per word), measured on our own chat text."""
    text = " ".join(corpus.chat_passages() + corpus.chat_questions())
    chars_per_word = len(text) / len(text.split())
    assert abs(chars_per_word / (4 / 3) - TEXT_CHARS_PER_TOKEN) < 0.25
