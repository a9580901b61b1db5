"""Held-out fits (rig sim fit --hold-out [--folds K]): each point is predicted by a fit that never saw it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rig.sim import holdout
from rig.sim.fit import Target, _server_limits
from rig.sim.virtual import Scenario


def targets(n_points: int) -> list[Target]:
    out = []
    for i in range(n_points):
        sc = Scenario(i % 3, 1 + i, 4, (8,), ("p",), label=f"point {i}")
        out.append(Target(f"steps{sc.steps} C={sc.concurrency} T=0 aggregate", "aggregate_tok_s", 100.0 + i, sc))
        out.append(Target(f"steps{sc.steps} C={sc.concurrency} T=0 per-request", "decode_tok_s", 10.0 + i, sc))
    return out


@pytest.fixture
def recorded_fits(monkeypatch):
    """fit and evaluate replaced by recorders: which points each fit saw, and a prediction per test target."""
    seen: list[set[str]] = []

    def fake_fit(train, base, free, max_evals, first_step=None):
        seen.append({holdout.point_of(t) for t in train})
        return SimpleNamespace(profile=len(seen))

    def fake_evaluate(profile, test):
        return [{"label": t.label, "metric": t.metric, "target": t.value, "sim": t.value * 1.1} for t in test]

    monkeypatch.setattr(holdout, "fit", fake_fit)
    monkeypatch.setattr(holdout, "evaluate", fake_evaluate)
    return seen


@pytest.mark.parametrize("folds", [None, 2, 3, 7])
def test_every_point_is_held_out_once_by_a_fit_that_never_saw_it(recorded_fits, folds):
    ts = targets(7)
    rows = holdout.hold_out_each_point(ts, base=None, free=(), max_evals=1, folds=folds)
    points = {holdout.point_of(t) for t in ts}
    assert len(recorded_fits) == (7 if folds is None else folds)
    assert sorted(r.point for r in rows) == sorted(holdout.point_of(t) for t in ts)  # each figure predicted once
    held_by_fit = [points - s for s in recorded_fits]
    assert sorted(p for held in held_by_fit for p in held) == sorted(points)  # the folds partition the points
    for r in rows:
        fit_that_predicted = next(i for i, held in enumerate(held_by_fit) if r.point in held)
        assert r.point not in recorded_fits[fit_that_predicted]
    assert all(r.rel_err == pytest.approx(0.1) for r in rows)


def test_folds_outside_two_to_the_number_of_points_are_refused(recorded_fits):
    with pytest.raises(ValueError, match="from 2 to the number of measured points"):
        holdout.hold_out_each_point(targets(3), base=None, free=(), max_evals=1, folds=4)


def test_a_real_runs_points_replay_under_their_servers_startup_limits(tmp_path):
    """The fit replays each point under the limits its own server logged at startup (two servers at one steps value,
    as a prove run's static and schedule arms, each keep theirs); adaptive servers are named, to be left out."""
    cfg = {
        "a": {"knobs": {"engine": "sglang", "steps": 0, "tp": 1}, "startup": {"max_running_requests": 4096}},
        "b": {
            "knobs": {"engine": "sglang", "steps": 3, "tp": 2},
            "startup": {"max_running_requests": 48, "max_total_num_tokens": 2_634_680},
        },
        "c1": {"knobs": {"engine": "sglang", "steps": 4, "tp": 1}, "startup": {"max_running_requests": 48}},
        "c2": {
            "knobs": {"engine": "sglang", "steps": 4, "tp": 1, "extra_args": ["--speculative-adaptive"]},
            "startup": {"max_running_requests": 40},
        },
        "sim": {"knobs": {"engine": "sim", "steps": 1, "tp": 4}, "startup": {"max_running_requests": 22}},
        "none": {"knobs": {"engine": "sglang", "steps": 2, "tp": 1}, "startup": {}},
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"server_configs": cfg}))
    limits, adaptive = _server_limits(tmp_path)
    assert limits == {
        "a": {"max_running": 4096},
        "b": {"max_running": 48, "kv_pool_tokens": 2_634_680},
        "c1": {"max_running": 48},
        "c2": {"max_running": 40},
    }  # a simulated server's limits are its profile's; one that logged none has none
    assert adaptive == {"c2"}


def test_a_real_runs_points_replay_with_their_recorded_prompt_lengths():
    """Prompt text is not recorded, its length is: each stand-in has the request's length and a prefix of its own."""
    from rig.sim.fit import _stand_in_prompts
    from rig.sim.text import content_score, tokenize

    filler = "Explain how this system works in detail."
    prompts = _stand_in_prompts([83, 2160, 1, float("nan")], filler)
    assert [len(tokenize(p)) for p in prompts] == [83, 2160, 1, 8]  # NaN: the filler's own length
    assert len({tokenize(p)[0] for p in prompts}) == 4  # no two share a first token, so no cached prefix
    # the content reads as the filler does at every length (a repeated filler read as repetitive text)
    assert {content_score(tokenize(p)) for p in prompts[:2]} == {content_score(tokenize(filler))}


def test_each_point_of_a_real_run_is_its_own_target_and_adaptive_points_are_left_out():
    """The H200 sweep (tests/data/h200-sglang-0.5.17-run: steps 0 and 3 at C=4 and 16): one target set per point,
    each replayed under its own server's limits; the H100 adaptive run (every point adaptive) has none to fit."""
    from support import DATA

    from rig.sim.fit import run_dir_targets

    targets = run_dir_targets(DATA / "h200-sglang-0.5.17-run")
    aggregates = {t.label: t.scenario for t in targets if t.metric == "aggregate_tok_s"}
    assert sorted(aggregates) == [f"steps{s} C={c} T=0 aggregate" for s in (0, 3) for c in (16, 4)]
    assert {n: sc.max_running for n, sc in aggregates.items()} == {
        n: 4096 if n.startswith("steps0") else 48 for n in aggregates
    }
    with pytest.raises(ValueError, match="no closed-loop points to fit to"):
        run_dir_targets(DATA / "h100-2026-12-07" / "adaptive-run")
