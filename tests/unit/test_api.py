"""The Python API (rig.open_run, rig.compare) on the checked-in golden run: typed manifest and points, requests
filtered by point as Arrow / pandas / Polars, every report section as a frame, the paired comparison, and the
example notebook docs/api_example.ipynb executed cell by cell."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from golden import OUT, RUN

import rig
from rig.analysis.runs import AnalysisInputError
from rig.contracts import Manifest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "api_example.ipynb"


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
