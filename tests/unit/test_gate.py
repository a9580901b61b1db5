"""rig compare as a CI gate (issue 24): exit 1 only when the paired interval lies beyond the threshold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from synthetic import greedy_rows, point_entry, write_requests, write_run

from rig.analysis import resample as rs
from rig.analysis.cli import compare as compare_cmd
from rig.analysis.compare import bootstrap_mean_ci, compare
from rig.analysis.gate import Threshold, judge, parse_threshold

N = 400
TOKENS = 101


def _write(d: Path, point: str, steps: int, tpot: np.ndarray) -> None:
    """N requests with TTFT 0.2 s and the given TPOTs (100 decode tokens each)."""
    write_requests(d, point, 0, greedy_rows(point, steps, np.full(tpot.size, 0.2), 0.2 + tpot * (TOKENS - 1), TOKENS))


def make_run(d: Path, factor: np.ndarray) -> Path:
    """Baseline TPOTs spread 10-30 ms; the candidate's are the same requests' times ``factor``."""
    base = np.random.default_rng(5).uniform(0.010, 0.030, N)
    write_run(d, {"run_id": d.name, "status": "complete", "points": [point_entry("base", 0), point_entry("cand", 2)]})
    _write(d, "base", 0, base)
    _write(d, "cand", 2, base * factor)
    return d


def test_parse_threshold():
    assert parse_threshold("tpot_p99=3%") == Threshold("tpot", "p99", 0.03)
    assert parse_threshold("ttft=5%") == Threshold("ttft", "mean", 0.05)
    assert parse_threshold("decode_tok_s_gm=2.5%") == Threshold("decode_tok_s", "gm", 0.025)
    assert parse_threshold("failed=0.5%") == Threshold("failed", "share", 0.005)
    assert parse_threshold("failed=0.5%").name == "failed"
    for bad in ("tpot_p99=3", "itl_p99=3%", "tpot_p42=3%", "tpot=-1%", "=3%"):
        with pytest.raises(ValueError, match="max-regression"):
            parse_threshold(bad)


def test_judge_verdicts_on_known_regressions():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.01, 0.03, 5000)
    t = Threshold("tpot", "p99", 0.03)
    slower = judge(t, base, base * 1.10, 1000, 0)  # every request exactly 10 % slower: p99 too
    assert slower["regression"] == pytest.approx(0.10)
    assert slower["verdict"] == "fail" and slower["ci_low"] > 0.03 and "with 95% confidence" in slower["why"]
    assert judge(Threshold("tpot", "p99", 0.20), base, base * 1.10, 1000, 0)["verdict"] == "pass"
    # a regression near the threshold with noisy requests: the interval holds 3 %, so it is not shown beyond it
    few = base[:200]
    spread = np.where(np.arange(few.size) % 2 == 0, 0.005, -0.005)  # sums to zero: the mean is exactly 3 % worse
    noisy = judge(Threshold("tpot", "mean", 0.03), few, few * 1.03 + spread, 1000, 0)
    assert noisy["regression"] == pytest.approx(0.03)
    assert noisy["ci_low"] < 0.03 < noisy["ci_high"]
    assert noisy["verdict"] == "pass" and "not shown to be exceeded" in noisy["why"]
    # rates: a lower decode speed is the regression
    rate = judge(Threshold("decode_tok_s", "mean", 0.03), 1 / base, 1 / (base * 1.10), 1000, 0)
    assert rate["verdict"] == "fail"
    faster = judge(t, base, base * 0.9, 1000, 0)
    assert faster["regression"] == pytest.approx(-0.1) and faster["verdict"] == "pass"
    nothing = judge(t, np.empty(0), np.empty(0), 100, 0)  # nothing to judge: the gate cannot vouch for it
    assert nothing["verdict"] == "fail" and "nothing to judge" in nothing["why"]


def test_gate_through_the_cli(tmp_path):
    d = make_run(tmp_path / "run", np.full(N, 1.10))
    r = CliRunner().invoke(
        compare_cmd, [f"{d}:base", f"{d}:cand", "--max-regression", "tpot_p99=3%", "--max-regression", "ttft=1%"]
    )
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith(("FAIL", "pass"))]
    assert len(lines) == 3
    assert lines.pop(0).startswith("pass  served  base -> cand: every one of the 400 requests")
    assert lines[0].startswith("FAIL  tpot_p99 <= +3.0%  base -> cand: +10.0%") and "worse than +3.0%" in lines[0]
    assert lines[1].startswith("pass  ttft_mean <= +1.0%  base -> cand: +0.0%") and "within +1.0%" in lines[1]
    r = CliRunner().invoke(compare_cmd, [f"{d}:base", f"{d}:cand", "--max-regression", "tpot_p99=20%", "--json"])
    assert r.exit_code == 0, r.output
    served, g = json.loads(r.output)["gate"]
    assert (served["metric"], served["verdict"], served["pairs"], served["regression"]) == ("served", "pass", N, 0.0)
    assert (g["metric"], g["verdict"], g["pairs"]) == ("tpot_p99", "pass", N)
    assert g["regression"] == pytest.approx(0.10)
    r = CliRunner().invoke(compare_cmd, [f"{d}:base", f"{d}:cand", "--max-regression", "tpot_p99=3"])
    assert r.exit_code == 2 and "expected METRIC[_STAT]=PCT%" in r.output
    # without thresholds the comparison is what it was (no gate key)
    assert "gate" not in compare(f"{d}:base", f"{d}:cand")


def test_m_out_of_n_bootstrap_matches_normal_theory_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "BOOTSTRAP_DRAWS", 100)
    x = np.random.default_rng(2).normal(1.0, 2.0, 20_000)
    lo, hi = bootstrap_mean_ci(x, 4000, 0)
    half = 1.96 * x.std() / np.sqrt(x.size)
    assert (lo, hi) == pytest.approx((x.mean() - half, x.mean() + half), abs=0.1 * half)
    d = make_run(tmp_path / "run", np.full(N, 1.10))
    res = compare(f"{d}:base", f"{d}:cand")
    assert any("m-out-of-n bootstrap" in w for w in res["warnings"])  # N = 400 pairs > 100 draws
    monkeypatch.setattr(rs, "BOOTSTRAP_DRAWS", 5_000)
    assert not any("m-out-of-n" in w for w in compare(f"{d}:base", f"{d}:cand")["warnings"])
