"""The regression gate fails what it cannot vouch for (issue 32, item 1): failed or missing requests the baseline
served, points flagged invalid or incomplete, levels or configurations one side lacks; --allow-incomplete waives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from synthetic import greedy_rows, point_entry, write_requests, write_run

from rig.analysis.cli import compare as compare_cmd
from rig.analysis.compare import compare

N = 60
GATE = ["--max-regression", "e2e=5%"]


def _rows(point: str, steps: int, concurrency: int) -> list[dict[str, Any]]:
    rows = greedy_rows(point, steps, np.full(N, 0.2), 0.2 + np.linspace(1.0, 2.0, N), 101)
    for r in rows:
        r["concurrency"] = concurrency
    return rows


def _fail(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        r.update(status="failed", ok=False, error="HTTP 500", first_token_ts=None, ttft_s=None, completion_tokens=0)


def make_run(
    d: Path,
    levels: tuple[int, ...] = (4, 8),
    configs: tuple[int, ...] = (2,),
    change: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None] | None = None,
    duration: bool = False,
    leave_out: tuple[str, ...] = (),
    **entry: Any,
) -> str:
    """A run of ``configs`` (steps) x ``levels`` (closed-loop concurrency) but the points ``leave_out``, N requests
    each, all served ok in the same times; ``change`` edits each point's rows (and may return fewer); ``entry`` goes
    into each point's entry (requests_scheduled: the rows written, unless given)."""
    planned = {} if duration else {"requests_planned": N}
    points = []
    for s in configs:
        for c in levels:
            name = f"s{s}c{c}"
            if name in leave_out:
                continue
            rows = _rows(name, s, c)
            rows = (change(rows) or rows) if change else rows
            write_requests(d, name, 0, rows)
            points.append(point_entry(name, s, concurrency=c, **{"requests_scheduled": len(rows), **planned, **entry}))
    spec = {"load": {"mode": "closed", "duration_s": 30.0 if duration else None}}
    write_run(d, {"run_id": d.name, "status": "complete", "spec": spec, "points": points})
    return str(d)


def gate(*args: str) -> tuple[int, list[str]]:
    r = CliRunner().invoke(compare_cmd, [*args, *GATE])
    lines = [ln for ln in r.output.splitlines() if ln.startswith(("FAIL", "pass", "waived", "gate:"))]
    return r.exit_code, lines


def _all_failed(rows: list[dict[str, Any]]) -> None:
    _fail(rows)


def _slowest_half_failed(rows: list[dict[str, Any]]) -> None:
    _fail(sorted(rows, key=lambda r: r["e2e_s"])[N // 2 :])


@pytest.mark.parametrize(("change", "lost"), [(_all_failed, N), (_slowest_half_failed, N // 2)])
def test_a_candidate_that_failed_what_the_baseline_served_fails_the_gate(tmp_path, change, lost):
    base, cand = make_run(tmp_path / "base"), make_run(tmp_path / "cand", change=change)
    code, lines = gate(base, cand)
    assert code == 1, lines
    served = [ln for ln in lines if "served" in ln.split()[1]]
    assert len(served) == 2 and all(ln.startswith("FAIL  served") for ln in served)
    assert (
        f"did not serve {lost} of the {N} requests base:s2c4 served ok ({lost} failed: most often HTTP 500)"
        in (served[0])
    )
    assert lines[-1].startswith("gate: FAIL")
    rows = compare(base, cand, max_regression=_thresholds(), allow_incomplete=False)["gate"]
    row = next(r for r in rows if r["metric"] == "served")
    assert (row["pairs"], row["regression"], row["verdict"]) == (N, pytest.approx(lost / N), "fail")
    # failed requests are evidence, not a gap: --allow-incomplete does not waive them
    code, lines = gate(base, cand, "--allow-incomplete")
    assert code == 1, lines
    assert any(ln.startswith("FAIL  served") and "failed requests are not waived" in ln for ln in lines)


def test_failed_share_tolerates_some_failures_and_only_those(tmp_path):
    """--max-regression failed=PCT% tolerates that share of the baseline's served requests failing; missing ones are
    a gap (waived only by --allow-incomplete)."""
    base = make_run(tmp_path / "base")
    one = make_run(tmp_path / "one", change=lambda rows: _fail(rows[:1]))  # 1 of 60 failed: 1.7 %
    assert gate(base, one)[0] == 1
    code, lines = gate(base, one, "--max-regression", "failed=2%")
    assert code == 0, lines
    [served] = [ln for ln in lines if ln.startswith("pass  served") and "s2c4" in ln]
    assert "1 of the 60 requests base:s2c4 served ok failed (1.7%) (failed=2.0% tolerated)" in served
    assert gate(base, one, "--max-regression", "failed=1%")[0] == 1

    # one failed and ten missing: the failure is tolerated, the gap is not, unless --allow-incomplete
    def one_failed_ten_missing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _fail(rows[:1])
        return rows[: N - 10]

    gap = make_run(tmp_path / "gap", change=one_failed_ten_missing, requests_scheduled=N)
    code, lines = gate(base, gap, "--max-regression", "failed=2%")
    assert code == 1 and any(ln.startswith("FAIL  served") and "10 not in its records" in ln for ln in lines)
    code, lines = gate(base, gap, "--max-regression", "failed=2%", "--allow-incomplete")
    assert code == 0, lines
    assert any(ln.startswith("waived  served") for ln in lines)
    row = next(r for r in compare(base, gap, max_regression=_thresholds())["gate"] if r["metric"] == "served")
    assert (row["failed"], row["pairs"], row["threshold"]) == (1, N, 0.0)


def _thresholds() -> list:
    from rig.analysis.gate import parse_threshold

    return [parse_threshold("e2e=5%")]


def test_requests_missing_from_the_candidate_fail_the_gate(tmp_path):
    base = make_run(tmp_path / "base")
    cand = make_run(tmp_path / "cand", change=lambda rows: rows[: N - 10], requests_scheduled=N)  # missing_rows
    code, lines = gate(base, cand)
    assert code == 1
    assert any(
        ln.startswith("FAIL  served") and "did not serve 10 of the 60" in ln and "10 not in its records" in ln
        for ln in lines
    )
    assert any(ln.startswith("FAIL  inputs") and "missing_rows (50 rows on disk of 60 scheduled)" in ln for ln in lines)


def test_duration_bound_levels_count_only_failed_requests(tmp_path):
    """A level bound by time ends when it is up: a point that sent fewer requests lost none; one that failed did."""
    base = make_run(tmp_path / "base", duration=True)
    fewer = make_run(tmp_path / "fewer", duration=True, change=lambda rows: rows[: N - 10])
    code, lines = gate(base, fewer)
    assert code == 0, lines
    assert any(ln.startswith("pass  served") and "only failed requests count" in ln for ln in lines)
    failed = make_run(tmp_path / "failed", duration=True, change=_slowest_half_failed)
    code, lines = gate(base, failed)
    assert code == 1 and any(ln.startswith("FAIL  served") and "30 failed" in ln for ln in lines)


def _corrupt_part(run: str) -> None:
    """A second generator's part file cut short (a copy that stopped half-way)."""
    d = Path(run)
    write_requests(d, "s2c4", 1, _rows("s2c4", 2, 4)[:3])
    [f] = (d / "requests" / "point=s2c4" / "gen=1").glob("*.parquet")
    f.write_bytes(f.read_bytes()[:100])


def test_unreadable_parts_and_invalid_points_fail_the_gate(tmp_path):
    base = make_run(tmp_path / "base")
    cand = make_run(tmp_path / "cand")
    _corrupt_part(cand)
    code, lines = gate(base, cand)
    assert code == 1
    [inputs] = [ln for ln in lines if ln.startswith("FAIL  inputs")]
    assert "cand:s2c4: unreadable_parts (1 part file(s) unreadable" in inputs
    # a point the run flagged invalid (its generator saturated) is no evidence either, on either side
    saturated = make_run(tmp_path / "sat", flags=["client_saturated"])
    for a, b in ((base, saturated), (saturated, base)):
        code, lines = gate(a, b)
        assert code == 1
        fails = [ln for ln in lines if ln.startswith("FAIL")]
        assert len(fails) == 2
        assert all(ln.startswith("FAIL  inputs") and "sat:s2c" in ln and "client_saturated" in ln for ln in fails)
    assert gate(base, saturated, "--allow-incomplete")[0] == 0


def test_levels_absent_from_either_side_fail_the_gate(tmp_path):
    base = make_run(tmp_path / "base")
    one = make_run(tmp_path / "one", levels=(4,))
    code, lines = gate(base, one)
    assert code == 1
    assert [ln for ln in lines if ln.startswith("FAIL")] == [
        "FAIL  coverage  base:s2c8 -> (none): base:s2c8 (greedy closed c=8 repeat 0, cfg2 (steps=2)): the "
        "candidate was not measured there"
    ]
    code, lines = gate(one, base)
    assert code == 1
    assert [ln for ln in lines if ln.startswith("FAIL")] == [
        "FAIL  coverage  (none) -> base:s2c8: base:s2c8 (greedy closed c=8 repeat 0, cfg2 (steps=2)): the "
        "baseline has no point there to compare with"
    ]
    assert gate(base, one, "--allow-incomplete")[0] == 0
    # a configuration the candidate run lacks
    two = make_run(tmp_path / "two", configs=(0, 2))
    code, lines = gate(two, base)
    assert code == 1
    assert sum(ln.startswith("FAIL  coverage  two:s0c") for ln in lines) == 2


def test_a_configuration_absent_at_a_level_of_one_run_fails_the_gate(tmp_path):
    d = make_run(tmp_path / "run", configs=(0, 2, 4), leave_out=("s4c8",))  # steps=4 never ran at c=8
    r = CliRunner().invoke(compare_cmd, [d, "--baseline-steps", "0", *GATE])
    assert r.exit_code == 1, r.output
    fails = [ln for ln in r.output.splitlines() if ln.startswith("FAIL")]
    assert fails == ["FAIL  coverage  configuration cfg4 (steps=4) has no point at greedy closed c=8 repeat 0"]


def test_nothing_to_judge_fails_and_allow_incomplete_needs_the_gate(tmp_path):
    base = make_run(tmp_path / "base", change=_all_failed)
    cand = make_run(tmp_path / "cand")
    code, lines = gate(base, cand)  # the baseline served nothing: no pairs, no evidence
    assert code == 1
    assert any(ln.startswith("FAIL  e2e_mean") and "nothing to judge" in ln for ln in lines)
    assert any(ln.startswith("pass  served") and "base:s2c4 served no request ok" in ln for ln in lines)
    r = CliRunner().invoke(compare_cmd, [base, cand, "--allow-incomplete"])
    assert r.exit_code == 2 and "give --max-regression too" in r.output
    # judging only what is there, when nothing is: every check waived still fails
    code, lines = gate(base, cand, "--allow-incomplete")
    assert code == 1, lines
    assert "FAIL  evidence  every check was waived: no request was judged" in lines[-2]
    assert lines[-1].startswith("gate: FAIL, 1 of")


def test_a_complete_candidate_passes_with_every_check_shown(tmp_path):
    base, cand = make_run(tmp_path / "base"), make_run(tmp_path / "cand")
    code, lines = gate(base, cand)
    assert code == 0, lines
    assert lines == [
        f"pass  served  base:s2c4 -> cand:s2c4: every one of the {N} requests base:s2c4 served ok was served ok",
        lines[1],
        f"pass  served  base:s2c8 -> cand:s2c8: every one of the {N} requests base:s2c8 served ok was served ok",
        lines[3],
        "gate: pass, 4 checks",
    ]
    assert lines[1].startswith("pass  e2e_mean <= +5.0%  base:s2c4 -> cand:s2c4: +0.0%")
