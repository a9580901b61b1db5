"""The Python API (rig.open_run, rig.compare) on the checked-in golden run: typed manifest and points, requests
filtered by point as Arrow / pandas / Polars, the server and GPU samples, every report section as a frame (the SLO
search, tune and prove sections from a manifest that records them), the paired comparison within a run and of two
runs, and the example notebook docs/api_example.ipynb executed cell by cell."""

from __future__ import annotations

import ast
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from golden import OUT, RUN
from support import DATA

import rig
from rig.analysis.runs import AnalysisInputError
from rig.contracts import (
    Manifest,
    Recommendation,
    SearchResult,
    SearchSection,
    TuneProbe,
    TuneSection,
    parse_manifest,
)
from rig.results import load_manifest, write_manifest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "api_example.ipynb"
SGLANG_RUN = DATA / "h200-sglang-0.5.17-run"  # real SGLang on an H200, with /metrics and NVML samples
PROVE_MANIFEST = DATA / "h100-2026-12-07-pm" / "prove_manifest.json.gz"  # rig prove on real SGLang (records not kept)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("api") / "run"
    shutil.copytree(RUN, d)
    return d


def _golden_json(name: str):
    text = (OUT / name).read_text()
    return json.loads(text.split("--- stdout\n", 1)[1].split("--- stderr", 1)[0])


def test_import_rig_stays_light():
    code = (
        "import sys, rig; heavy = [m for m in ('pandas', 'pyarrow', 'numpy', 'ray', 'matplotlib', 'rich') "
        "if m in sys.modules]; print(heavy); rig.open_run; print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "True"]  # nothing heavy until the API is touched


def test_manifest_points_and_requests_by_point(run_dir):
    run = rig.open_run(run_dir)
    assert isinstance(run.manifest, Manifest) and (run.run_id, run.status) == ("golden", "complete")
    assert run.point_names == [p.point for p in run.points] and len(run.points) == 4
    first = run.point_names[0]
    t = run.requests(point=first, columns=["point", "request_id", "completion_tokens"])
    assert isinstance(t, pa.Table) and t.column_names == ["point", "request_id", "completion_tokens"]
    assert set(t["point"].to_pylist()) == {first} and t.num_rows == 8
    campaign = {r["point"]: r for r in _golden_json("report.json")["campaign"]}
    assert pa.compute.sum(t["completion_tokens"]).as_py() == campaign[first]["tokens"]
    every = run.requests_df(columns=["point", "ok"])
    assert isinstance(every, pd.DataFrame) and len(every) == sum(r["requests"] for r in campaign.values())
    two = run.requests(point=run.point_names[:2], columns=["point"])
    assert set(two["point"].to_pylist()) == set(run.point_names[:2])
    with pytest.raises(AnalysisInputError, match="no point 'nope' in .* \\(points: sim-s0"):
        run.requests(point="nope")
    pts = run.points_df()
    assert list(pts.point) == run.point_names and "flags" in pts


def test_requests_as_a_lazy_polars_frame(run_dir):
    pl = pytest.importorskip("polars")
    run = rig.open_run(run_dir)
    lazy = run.requests_pl(point=run.point_names[1])
    assert isinstance(lazy, pl.LazyFrame)
    got = lazy.select(pl.col("completion_tokens").sum()).collect().item()
    assert got == run.requests_df(point=run.point_names[1])["completion_tokens"].sum()


def test_every_report_section_is_a_frame_with_the_reports_numbers(run_dir):
    run = rig.open_run(run_dir)
    for name in rig.SECTIONS:
        assert isinstance(run.section(name), pd.DataFrame), name
    golden = _golden_json("report.json")
    campaign = run.section("campaign").set_index("point")
    for row in golden["campaign"]:
        assert campaign.loc[row["point"], "aggregate_tok_s"] == pytest.approx(row["aggregate_tok_s"], rel=1e-12)
        assert campaign.loc[row["point"], "flags"] == row["flags"]
    bands = run.section("verdict")
    assert list(bands.best) == [b["best"] for b in golden["schedule"][0]["bands"]]
    assert bands.margin[0] == pytest.approx(golden["schedule"][0]["bands"][0]["margin"])
    assert run.section("health").loc[0, "valid"] == 3
    with_slo = _golden_json("report_slo.json")
    goodput = run.section("goodput", slos=["ttft=300ms", "tpot=10ms"])
    assert list(goodput.point) == [g["point"] for g in with_slo["goodput"]]
    assert run.report(slos=["ttft=300ms", "tpot=10ms"]) is run.report(slos=["ttft=300ms", "tpot=10ms"])  # kept
    with pytest.raises(ValueError, match="unknown section 'nope'"):
        run.section("nope")
    series = run.server_series(run.point_names[0])
    assert {"running", "queued", "token_usage"} <= set(series.quantity) and (series.value >= 0).all()


def test_compare_returns_the_paired_result_rig_compare_prints(run_dir):
    got = rig.compare(rig.open_run(run_dir), baseline_steps=0)
    want = _golden_json("compare.json")
    assert got.mode == want["mode"] and len(got.speedups) == len(want["speedups"])
    frame = got.frame("speedups")
    for mine, theirs in zip(frame.to_dict("records"), want["speedups"], strict=True):
        assert (mine["metric"], mine["pairs"]) == (theirs["metric"], theirs["pairs"])
        assert mine["speedup"] == pytest.approx(theirs["speedup"]) and mine["ci_low"] == pytest.approx(theirs["ci_low"])
    assert not got.failed and got.gate == []
    gated = rig.compare(str(run_dir), baseline_steps=0, max_regression=["tpot_p99=3%"])
    # beside the threshold, the gate's own checks: requests served, and the inputs (steps 4 at C=4 is flagged
    # client_saturated in the golden run, so the gate cannot vouch for that pair and fails)
    assert {g["metric"] for g in gated.gate} == {"tpot_p99", "served", "inputs"} and gated.failed
    waived = rig.compare(str(run_dir), baseline_steps=0, max_regression=["tpot_p99=3%"], allow_incomplete=True)
    assert [g["verdict"] for g in waived.gate if g["metric"] == "inputs"] == ["waived"]


def _split_by_steps(src: Path, dest: Path, steps: int) -> Path:
    """A run of ``src``'s points at ``steps`` only: its manifest cut down to them, the others' files left out."""
    m = load_manifest(src)
    keep = [p for p in m.points if p.steps == steps]
    drop = {f"point={p.point}" for p in m.points} - {f"point={p.point}" for p in keep}
    shutil.copytree(src, dest, ignore=lambda _, names: [n for n in names if n in drop])
    write_manifest(dest, m.model_copy(update={"run_id": f"golden-s{steps}", "points": keep}))
    return dest


def test_compare_two_runs_pairs_their_points_by_level(tmp_path):
    # the golden sweep split into a steps-0 run and a steps-4 run: the same pairs as within the one run
    a = _split_by_steps(RUN, tmp_path / "a", 0)
    b = _split_by_steps(RUN, tmp_path / "b", 4)
    got = rig.compare(rig.open_run(a), b)
    assert got.mode == "golden-s0 (baseline) vs golden-s4"
    want = _golden_json("compare.json")["speedups"]
    frame = got.frame("speedups")
    assert len(frame) == len(want) == 8
    for mine, theirs in zip(frame.to_dict("records"), want, strict=True):
        assert mine["baseline"] == f"golden-s0:{theirs['baseline']}" and mine["metric"] == theirs["metric"]
        assert (mine["speedup"], mine["ci_low"], mine["ci_high"]) == pytest.approx(
            (theirs["speedup"], theirs["ci_low"], theirs["ci_high"])
        )
    assert [(r["concurrency"], r["best"]) for r in got.best] == [(2, "golden-s4:steps=4"), (4, "golden-s4:steps=4")]


def test_server_and_gpu_samples_are_the_runs_rows():
    run = rig.open_run(SGLANG_RUN)
    point = run.point_names[0]
    gpu = run.gpu_metrics(point)
    on_disk = pa.concat_tables(
        pq.read_table(f) for f in sorted((SGLANG_RUN / "gpu_metrics" / f"point={point}").iterdir())
    )
    assert gpu.num_rows == on_disk.num_rows > 0 and set(gpu["point"].to_pylist()) == {point}
    assert sorted(gpu["ts"].to_pylist()) == sorted(on_disk["ts"].to_pylist())
    assert pc.sum(gpu["power_mw"]).as_py() == pc.sum(on_disk["power_mw"]).as_py()
    assert run.gpu_metrics().num_rows == sum(
        pq.read_metadata(f).num_rows for f in (SGLANG_RUN / "gpu_metrics").rglob("*.parquet")
    )
    srv = run.server_metrics(point)
    disk = [pq.read_table(f) for f in (SGLANG_RUN / "server_metrics" / f"point={point}").iterdir()]
    assert srv.num_rows == sum(t.num_rows for t in disk) > 0
    running = run.server_metrics(point, names=["sglang:num_running_reqs"])
    assert 0 < running.num_rows < srv.num_rows and set(running["name"].to_pylist()) == {"sglang:num_running_reqs"}
    assert running.num_rows == pc.sum(pc.equal(srv["name"], "sglang:num_running_reqs")).as_py()
    assert rig.open_run(RUN).gpu_metrics().num_rows == 0  # the golden run has no GPU telemetry: empty, not an error


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory) -> Path:
    """The golden run with an SLO search, a tune and rig prove's recorded section in its manifest (the report reads
    those sections from the manifest alone; prove's is the real one of tests/data/h100-2026-12-07-pm)."""
    d = tmp_path_factory.mktemp("api-adaptive") / "run"
    shutil.copytree(RUN, d)
    prove = parse_manifest(gzip.decompress(PROVE_MANIFEST.read_bytes()).decode(), PROVE_MANIFEST.name).prove
    search = SearchSection(
        describe="p99 ttft <= 300 ms",
        results=[
            SearchResult(
                server_config="sim-s4-01a61f00",
                steps=4,
                workload="realistic",
                status="bracketed",
                probes=3,
                max_passing={"level": 2, "margin": 0.25, "aggregate_tok_s": 312.0},
                min_failing={"level": 4, "margin": -0.1},
            )
        ],
    )
    probes = [
        TuneProbe(
            round=0,
            point="sim-s4-01a61f00-realistic-c2",
            server_config="sim-s4-01a61f00",
            steps=4,
            level=2,
            predicted_meets=True,
            meets=True,
            aggregate_tok_s=312.0,
        ),
        TuneProbe(
            round=1,
            point="sim-s4-01a61f00-realistic-c4",
            server_config="sim-s4-01a61f00",
            steps=4,
            level=4,
            predicted_meets=True,
            meets=False,
        ),
    ]
    tune = TuneSection(
        describe="p99 ttft <= 300 ms",
        probes=probes,
        recommendation=Recommendation(measured_points=2, grid_points=4, best_steps=4, answer="steps=4 up to C=2"),
    )
    m = load_manifest(d)
    write_manifest(d, m.model_copy(update={"search": search, "tune": tune, "prove": prove}))
    return d


def test_search_tune_and_prove_sections_are_frames(adaptive_run):
    run = rig.open_run(adaptive_run)
    [search] = run.section("search").to_dict("records")
    assert (search["server_config"], search["max_passing"], search["min_failing"]) == ("sim-s4-01a61f00", 2, 4)
    assert (search["mp_margin"], search["probes"], search["outcome"]) == (0.25, 3, "bracketed")
    tune = run.section("tune")
    assert list(tune.n) == [1, 2] and list(tune.verdict) == ["meets", "misses (mispredicted)"]
    assert list(tune.level) == [2, 4] and tune.aggregate_tok_s[0] == 312.0
    rec = run.section("tune_recommendation")
    assert len(rec) == 1 and rec.loc[0, "answer"] == "steps=4 up to C=2" and rec.loc[0, "grid_points"] == 4
    prove = run.section("prove")
    assert len(prove) == 4 * 2 and set(prove.arm) == {"schedule", "adaptive"}  # 4 bands x its 2 non-static arms
    verdicts = prove.set_index(["level", "arm"]).verdict
    assert [verdicts[(lvl, "schedule")] for lvl in (4.0, 16.0, 64.0)] == ["worse"] * 3
    assert {verdicts[(lvl, "adaptive")] for lvl in (1.0, 4.0, 16.0, 64.0)} == {"worse"}
    assert prove.best_static.notna().all() and {"margin", "ci_low", "ci_high", "steps_mean"} <= set(prove.columns)
    assert list(run.section("prove_schedule")[["batch_size", "steps"]].itertuples(index=False, name=None)) == [
        (1, 4),
        (2, 0),
    ]


def test_a_run_without_search_tune_or_prove_gives_empty_frames_with_their_columns(run_dir):
    run = rig.open_run(run_dir)
    want = {
        "search": {"server_config", "max_passing", "min_failing", "mp_margin", "probes"},
        "tune": {"n", "point", "predicted_meets", "meets", "verdict"},
        "tune_recommendation": {"answer", "evidence", "best_steps"},
        "prove": {"workload", "level", "best_static", "arm", "margin", "ci_low", "ci_high", "verdict"},
        "prove_schedule": {"batch_size", "steps"},
    }
    for name, columns in want.items():
        frame = run.section(name)
        assert frame.empty and columns <= set(frame.columns), name


def test_latency_cdfs_are_the_plots_quantiles(run_dir):
    run = rig.open_run(run_dir)
    cdfs = run.section("cdfs")
    assert list(cdfs.columns) == ["point", "metric", "value_s", "fraction"]
    assert set(cdfs.point) == set(run.point_names) and set(cdfs.metric) == {"ttft", "tpot", "itl", "e2e"}
    one = cdfs[(cdfs.point == run.point_names[0]) & (cdfs.metric == "ttft")]
    assert len(one) == rig.api.CDF_RESOLUTION and one.fraction.iloc[[0, -1]].tolist() == [0.0, 1.0]
    assert one.value_s.is_monotonic_increasing
    ttft = run.requests_df(point=run.point_names[0], columns=["ttft_s", "ok"]).query("ok").ttft_s
    assert (one.value_s.iloc[0], one.value_s.iloc[-1]) == pytest.approx((ttft.min(), ttft.max()))
    assert len(run.section("cdfs", cdf_resolution=11).query("metric == 'e2e'")) == 11 * len(run.point_names)
    assert run.report().cdfs == {}  # the other sections' report stays without them
    with pytest.raises(ValueError, match="cdf_resolution > 0"):
        run.section("cdfs", cdf_resolution=0)


def run_notebook(path: Path, env_run: Path) -> dict:
    """Execute the notebook's code cells in order in one namespace (what a kernel would do, without Jupyter)."""
    import os

    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    ns: dict = {"__name__": "__main__"}
    old_cwd, old_env = os.getcwd(), os.environ.get("RIG_EXAMPLE_RUN")
    os.environ["RIG_EXAMPLE_RUN"] = str(env_run)
    os.chdir(path.parent)
    try:
        for i, cell in enumerate(cells):
            tree = ast.parse("".join(cell["source"]), f"cell {i}")
            exec(compile(tree, f"{path.name} cell {i}", "exec"), ns)
    finally:
        os.chdir(old_cwd)
        if old_env is None:
            os.environ.pop("RIG_EXAMPLE_RUN", None)
        else:
            os.environ["RIG_EXAMPLE_RUN"] = old_env
    return ns


def test_the_example_notebook_runs(run_dir, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    ns = run_notebook(NOTEBOOK, run_dir)
    assert ns["run"].run_id == "golden" and len(ns["cmp"].speedups) == 8
    assert ns["tokens"].set_index("point")["completion_tokens_sum"].sum() == 1958 + 2051 + 1673 + 2286


def test_without_polars_one_clear_error(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "polars", None)  # as if not installed: `import polars` raises ImportError
    run = rig.open_run(run_dir)
    with pytest.raises(ImportError, match=r"Polars is not installed \(pip install polars\)"):
        run.requests_pl()
    assert run.requests_df(point=run.point_names[0]).shape[0] == 8  # the rest needs none
