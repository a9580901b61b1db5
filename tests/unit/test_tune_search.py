"""SLO search: bracketing and bisection over each domain, and the SLO verdict of a point."""

from __future__ import annotations

import numpy as np
import pytest

from rig.analysis import metrics as m
from rig.analysis.slo import evaluate_slos
from rig.tune.search import Bisection, IntDomain, RateDomain, ladder


def _run(b: Bisection, boundary: float) -> list[float]:
    """Drive a search against a monotone truth: meets iff value <= boundary."""
    seen = []
    while (v := b.next()) is not None:
        assert v not in seen, "a search never probes a value twice"
        seen.append(v)
        b.record(v, v <= boundary)
    return seen


@pytest.mark.parametrize("boundary", [1, 2, 3, 7, 8, 13, 100, 1023])
def test_int_search_finds_the_exact_boundary(boundary):
    b = Bisection(IntDomain(1, 1024), 1)
    probes = _run(b, boundary)
    assert (b.max_passing, b.min_failing) == (boundary, boundary + 1)
    assert b.outcome == "bracketed"
    assert len(probes) <= 2 * np.log2(boundary + 1) + 2  # logarithmic, not linear


def test_int_search_edges():
    b = Bisection(IntDomain(1, 64), 4)
    _run(b, 0)  # nothing passes: halves down to the minimum
    assert (b.max_passing, b.min_failing, b.outcome) == (None, 1, "none_pass")
    b = Bisection(IntDomain(1, 64), 4)
    _run(b, 10_000)  # everything passes: doubles up to the maximum
    assert (b.max_passing, b.min_failing, b.outcome) == (64, None, "capped")
    assert [v for v, _ in b.probes] == [4, 8, 16, 32, 64]
    b = Bisection(IntDomain(1, 64), 16)
    _run(b, 5)  # start above the boundary: halve, then bisect
    assert (b.max_passing, b.min_failing) == (5, 6)


def test_rate_search_stops_within_tolerance():
    b = Bisection(RateDomain(0.05, 1000, tolerance=0.05), 1.0)
    _run(b, 6.3)
    assert b.max_passing <= 6.3 < b.min_failing
    assert b.min_failing / b.max_passing <= 1.05


def test_ladder_search_stays_on_the_ladder():
    levels = (1, 2, 4, 8, 16, 32, 64)
    b = Bisection(ladder(levels), 4)
    probes = _run(b, 20)
    assert set(probes) <= set(levels)
    assert (b.max_passing, b.min_failing) == (16, 32)


def _requests(ttft, e2e, tokens, ok=None):
    n = len(ttft)
    ok = np.ones(n, bool) if ok is None else np.asarray(ok, bool)
    nan = np.full(n, np.nan)
    return m.Requests(
        ok=ok,
        cancelled=np.zeros(n, bool),
        tokens=np.asarray(tokens, float),
        ttft=np.asarray(ttft, float),
        e2e=np.asarray(e2e, float),
        send=np.zeros(n),
        end=np.ones(n),
        slip=nan,
        e2e_from_intended=nan,
        verify_ct=nan,
    )


def test_slo_verdict_percentile_margin_and_failures():
    # 100 requests, TTFT 1..100 ms; TPOT 10 ms each (E2E = TTFT + 10 ms x 10 tokens after the first).
    ttft = np.arange(1, 101) / 1000
    r = _requests(ttft, ttft + 0.1, np.full(100, 11))
    slos = [m.parse_slo("ttft=99.5ms"), m.parse_slo("tpot=20ms")]
    v = evaluate_slos(r, slos, 99)
    assert v["per_slo"][0]["value_s"] == pytest.approx(np.percentile(ttft, 99))  # 99.01 ms
    assert v["meets"]
    assert v["margin"] == pytest.approx((0.0995 - np.percentile(ttft, 99)) / 0.0995)
    assert v["per_slo"][1]["margin"] == pytest.approx(0.5)
    # At p100 the slowest request (100 ms) breaks the TTFT SLO.
    assert not evaluate_slos(r, slos, 100)["meets"]
    # Two failed requests of 100 count as infinitely slow: p99 fails although every ok request is fast.
    ok = np.ones(100, bool)
    ok[:2] = False
    fast = _requests(np.full(100, 0.001), np.full(100, 0.05), np.full(100, 11), ok)
    v = evaluate_slos(fast, slos, 99)
    assert not v["meets"] and v["margin"] == -1.0
    # ... while one failure in 100 is within p98's allowance.
    ok[1] = True
    assert evaluate_slos(_requests(np.full(100, 0.001), np.full(100, 0.05), np.full(100, 11), ok), slos, 98)["meets"]


# --- through the CLI against the simulator --------------------------------------------------------------------------


# --- tune's decision rule, on known measurements and predictions ----------------------------------------------------

from rig.tune.predict import Prediction, Verdict  # noqa: E402
from rig.tune.tune import Knowledge  # noqa: E402

LADDER = [1, 2, 4, 8, 16]


def _know(measured: dict, predicted: dict) -> Knowledge:
    """Configs a, b, c; predicted margins per (config, level), measured verdicts per (config, level)."""
    return Knowledge(
        LADDER,
        ["a", "b", "c"],
        {k: Verdict(meets=v, aggregate_tok_s=100.0) for k, v in measured.items()},
        {
            k: Prediction(meets=v >= 0, margin=v, aggregate_tok_s=100.0 + i)
            for i, (k, v) in enumerate(predicted.items())
        },
    )


def _pred(caps: dict[str, int], margin: float = 0.5) -> dict:
    """Each config meets the SLOs up to its capacity with this margin and misses above by the same."""
    return {(c, lv): (margin if lv <= cap else -margin) for c, cap in caps.items() for lv in LADDER}


def test_tune_measures_the_leaders_boundary_and_only_undecided_contenders():
    know = _know({}, {**_pred({"a": 8, "b": 2, "c": 4}), ("c", 8): -0.1})
    assert know.leader() == ("a", 8)
    need = {(c, lv) for c, lv, _ in know.needed(confidence=0.2)}
    # a at 8 and 16 (its boundary); c at 8 is predicted to miss by only 10 %: measured; b misses by 50 %: trusted.
    assert need == {("a", 8), ("a", 16), ("c", 8)}


def test_measurements_override_predictions_through_monotonicity():
    # a passes at 4 (so at 1 and 2 too) and misses at 8 (so at 16 too): its boundary is known, nothing left for it.
    know = _know({("a", 4): True, ("a", 8): False, ("b", 4): False}, _pred({"a": 16, "b": 4, "c": 2}))
    assert know.known("a", 2) is True and know.known("a", 16) is False and know.known("b", 8) is False
    assert know.capacity("a") == 4 and know.capacity("b") == 2
    assert know.leader() == ("a", 4)
    assert know.needed(0.2) == []  # b misses at 4 (measured), c is predicted to miss there by 50 %
    # A tie at the leader's level is measured (both points' throughput decides), and one level up.
    know = _know({("a", 4): True, ("a", 8): False}, _pred({"a": 16, "b": 4, "c": 1}))
    assert {(c, lv) for c, lv, _ in know.needed(0.2)} == {("b", 4), ("b", 8)}


def test_nothing_passes_anywhere_checks_the_lowest_level():
    know = _know({("a", 1): False}, _pred({"a": 0, "b": 0, "c": 0}))
    assert know.leader() == (None, None)
    assert {(c, lv) for c, lv, _ in know.needed(0.2)} == {("b", 1), ("c", 1)}
