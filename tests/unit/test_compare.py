"""rig compare: paired per-request speedups with bootstrap CIs, and the best steps per level, on known ratios."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from synthetic import greedy_rows, point_entry, write_requests, write_run

from rig.analysis.cli import compare as compare_cmd
from rig.analysis.compare import bootstrap_mean_ci, compare, parse_target

N = 40
TOKENS = 101


def _write_point(d: Path, point: str, steps: int, ratios: np.ndarray) -> None:
    """N requests; the candidate's latencies are the baseline's (e2e 2 s, ttft 0.2 s) divided by ``ratios``."""
    write_requests(d, point, 0, greedy_rows(point, steps, 0.2 / ratios, 2.0 / ratios, TOKENS))


def make_compare_run(d: Path, ratios: np.ndarray) -> Path:
    write_run(d, {"run_id": d.name, "status": "complete", "points": [point_entry("base", 0), point_entry("cand", 2)]})
    _write_point(d, "base", 0, np.ones(N))
    _write_point(d, "cand", 2, ratios)
    return d


def _speedup(result: dict, metric: str) -> dict:
    return next(r for r in result["speedups"] if r["metric"] == metric)


def test_constant_ratio_gives_exact_speedup_and_margin(tmp_path):
    d = make_compare_run(tmp_path / "run", np.full(N, 2.0))
    res = compare(str(d), baseline_steps=0)
    for metric in ("e2e", "ttft", "tpot", "decode_tok_s"):
        s = _speedup(res, metric)
        assert s["pairs"] == N
        assert (s["speedup"], s["ci_low"], s["ci_high"]) == pytest.approx((2.0, 2.0, 2.0))
    [best] = res["best"]
    assert best["best"] == "steps=2" and best["runner_up"] == "steps=0"
    # walls: base 3.9 + 2.0 = 5.9 s, candidate 3.9 + 1.0 = 4.9 s, same tokens
    assert best["best_aggregate_tok_s"] == pytest.approx(N * TOKENS / 4.9)
    assert best["runner_up_aggregate_tok_s"] == pytest.approx(N * TOKENS / 5.9)
    assert best["margin"] == pytest.approx(5.9 / 4.9 - 1)
    assert (best["ci_low"], best["ci_high"]) == pytest.approx((5.9 / 4.9 - 1,) * 2)  # no per-request variability
    assert best["ci_method"] == "requests"


def test_varying_ratio_geometric_mean_and_ci(tmp_path):
    ratios = np.where(np.arange(N) % 2 == 0, 1.5, 2.5)
    d = make_compare_run(tmp_path / "run", ratios)
    res = compare(f"{d}:base", f"{d}:cand", resamples=4000, seed=1)
    s = _speedup(res, "e2e")
    assert s["speedup"] == pytest.approx(np.sqrt(1.5 * 2.5))
    # Normal theory for the mean of the logs: sd = ln(2.5/1.5)/2, se = sd/sqrt(N)
    se = np.log(2.5 / 1.5) / 2 / np.sqrt(N)
    assert s["ci_low"] == pytest.approx(np.sqrt(3.75) * np.exp(-1.96 * se), rel=0.02)
    assert s["ci_high"] == pytest.approx(np.sqrt(3.75) * np.exp(1.96 * se), rel=0.02)
    assert s["baseline"] == "base" and s["candidate"] == "cand"
    assert compare(f"{d}:base", f"{d}:cand", resamples=4000, seed=1)["speedups"] == res["speedups"]  # seeded


def test_two_runs_pair_by_level(tmp_path):
    a = make_compare_run(tmp_path / "a", np.full(N, 1.25))
    b = make_compare_run(tmp_path / "b", np.full(N, 2.5))
    res = compare(str(a), str(b))
    # base pairs with base (same steps), cand with cand: 2.5 / 1.25 = 2
    by = {r["candidate_point"]: r for r in res["speedups"] if r["metric"] == "e2e"}
    assert by["base"]["speedup"] == pytest.approx(1.0)
    assert by["cand"]["speedup"] == pytest.approx(2.0)
    assert res["best"][0]["best"] == "b:steps=2"


def test_bootstrap_ci_is_seeded():
    x = np.random.default_rng(3).normal(size=200)
    assert bootstrap_mean_ci(x, 500, 7) == bootstrap_mean_ci(x, 500, 7)
    lo, hi = bootstrap_mean_ci(x, 2000, 7)
    assert lo < x.mean() < hi


def test_parse_target(tmp_path):
    assert parse_target(f"{tmp_path}:p1") == (tmp_path, "p1")
    assert parse_target(str(tmp_path)) == (tmp_path, None)


def test_compare_cli(tmp_path):
    d = make_compare_run(tmp_path / "run", np.full(N, 2.0))
    r = CliRunner().invoke(compare_cmd, [str(d), "--baseline-steps", "0", "--json"])
    assert r.exit_code == 0, r.output
    assert _speedup(json.loads(r.output), "e2e")["speedup"] == pytest.approx(2.0)
    r = CliRunner().invoke(compare_cmd, [str(d), "--baseline-steps", "0"])
    assert r.exit_code == 0 and "steps=2" in r.output
    for args in (
        [str(d)],
        [str(tmp_path / "nope"), str(d)],
        [f"{d}:nopoint", f"{d}:cand"],
        [str(d), "--baseline-steps", "9"],
        [str(d), str(d), "--baseline-steps", "0"],
    ):
        r = CliRunner().invoke(compare_cmd, args)
        assert r.exit_code != 0
        assert r.exception is None or isinstance(r.exception, SystemExit), args
        assert len(r.output.strip().splitlines()) == 1 and r.output.startswith("Error:"), r.output
