"""The report's faster paths give what the plain ones give: exact percentiles by selection and by sort (numpy's
numbers), the pairing by lookup (the hash join's table), the memo bounded by bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from test_compare import make_compare_run

from rig.analysis import memo as memo_mod
from rig.analysis import metrics as m
from rig.analysis import pairing
from rig.analysis.runs import load_run


@pytest.mark.parametrize("seed", range(20))
def test_order_statistics_are_those_of_a_sort(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    a = rng.integers(0, 20, n).astype(float) if seed % 2 else rng.normal(size=n)  # ties on odd seeds
    ks = rng.integers(0, n, int(rng.integers(1, 9))).tolist() + [n - 1]
    want = np.sort(a)
    got = m.order_statistics(a.copy(), ks)
    assert got == {k: want[k] for k in ks}


@pytest.mark.parametrize("seed", range(10))
def test_percentiles_equal_numpys_exactly(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 2000))
    v = rng.gamma(2.0, 0.05, n)
    v[rng.random(n) < 0.05] = np.nan
    w = rng.integers(1, 5, n)
    fin = v[np.isfinite(v)]
    s = m.summarize(v)
    assert [s.p50, s.p90, s.p95, s.p99] == [float(x) for x in np.percentile(fin, m.PERCENTILES)]
    expanded = np.repeat(v, w)
    expanded = expanded[np.isfinite(expanded)]
    got = m.weighted_percentiles(v, w, [0, 1, 50, 90, 95, 99, 100])
    assert got == pytest.approx(list(np.percentile(expanded, [0, 1, 50, 90, 95, 99, 100])), rel=1e-12)
    assert got == m.weighted_percentiles(*m.sort_weighted(v, w), [0, 1, 50, 90, 95, 99, 100], presorted=True)


def _join(a: pa.Table, b: pa.Table) -> pa.Table:
    j = a.join(b, "request_id", left_suffix="_base", right_suffix="_cand", join_type="inner")
    return j.sort_by("request_id")


def test_pairing_by_lookup_is_the_sorted_join(tmp_path):
    run = load_run(make_compare_run(tmp_path / "run", np.linspace(1.0, 2.0, 40)))
    base, cand = (pairing.Side(run, run.point(p), p) for p in ("base", "cand"))
    (a, _, distinct_a), (b, _, distinct_b) = pairing._per_request(base), pairing._per_request(cand)
    assert distinct_a and distinct_b
    got, note = pairing.paired_table(base, cand)
    assert note is None
    assert got.num_rows == 40
    assert got.equals(_join(a, b))


def test_pairing_with_repeated_ids_keeps_the_join(tmp_path, monkeypatch):
    run = load_run(make_compare_run(tmp_path / "run", np.linspace(1.0, 2.0, 40)))
    base, cand = (pairing.Side(run, run.point(p), p) for p in ("base", "cand"))
    a, why, _ = pairing._per_request(base)
    ids = pa.array(["r0"] * 2 + [f"r{i}" for i in range(2, 40)])
    twice = a.set_column(0, "request_id", ids.take(pa.array(range(40))))
    real = pairing._per_request
    monkeypatch.setattr(pairing, "_per_request", lambda s: (twice, why, False) if s is base else real(s))
    got, _ = pairing.paired_table(base, cand)
    assert got.num_rows == 40  # r0 of the base twice, each beside the candidate's r0; r1 nowhere
    assert got["request_id"].to_pylist().count("r0") == 2
    assert "r1" not in got["request_id"].to_pylist()


def test_memo_keeps_small_results_and_evicts_to_two_over_budget(tmp_path, monkeypatch):
    run = load_run(make_compare_run(tmp_path / "run", np.ones(40)))
    for i in range(5):
        run.memo(f"small{i}", "base", lambda: np.zeros(10))
    assert len(run._memo.kept_keys()) == 5
    monkeypatch.setattr(memo_mod, "MEMO_BYTES", 1000)
    for i in range(3):
        run.memo(f"big{i}", "base", lambda: np.zeros(1000))
    assert [k[0] for k in run._memo.kept_keys()] == ["big1", "big2"]  # over the budget: the newest MEMO_ENTRIES
    assert memo_mod.nbytes((np.zeros(3), [np.zeros(2)], pa.table({"x": [1.0]}))) == 24 + 16 + 8


@pytest.mark.parametrize("small_point,small_run", [(0, 0), (0, 2**40)])
def test_report_of_large_points_is_the_report_of_small_ones(tmp_path, monkeypatch, small_point, small_run):
    """Large points read one at a time (their ITL after their columns) and sections one after another; the same
    report as small points read ahead on two threads with sections side by side."""
    import shutil

    from golden import RUN

    from rig.analysis.report import Reader, build_report, full_json, to_json

    run_dir = shutil.copytree(RUN, tmp_path / "run")
    slos = [m.parse_slo("ttft=500ms"), m.parse_slo("tpot=50ms")]

    def everything(rep):
        return to_json({**full_json(rep), "latency": rep.latency, "lossless": rep.lossless.model_dump(mode="json")})

    want = everything(build_report(run_dir, slos))
    monkeypatch.setattr(Reader, "SMALL_POINT", small_point)
    monkeypatch.setattr(Reader, "SMALL_RUN", small_run)
    assert everything(build_report(run_dir, slos)) == want


def test_memo_makes_once_for_two_threads(tmp_path):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    run = load_run(make_compare_run(tmp_path / "run", np.ones(40)))
    made, gate = [], threading.Event()

    def make():
        made.append(1)
        gate.wait(5)
        return np.arange(3)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(run.memo, "x", "base", make)
        second = pool.submit(run.memo, "x", "base", make)
        gate.set()
        a, b = first.result(), second.result()
    assert made == [1]
    assert a is b

    def fail():
        raise OSError("gone")

    with pytest.raises(OSError):
        run.memo("y", "base", fail)
    assert run.memo("y", "base", lambda: 7) == 7  # a failure is not kept
