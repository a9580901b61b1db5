"""Energy, J/token and $/Mtok per point (rig/analysis/energy.py), their paired comparison, and the speculative
schedule by load (rig/analysis/schedule.py), on the golden run with synthetic gpu_metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support import DATA

from rig.analysis.compare import compare
from rig.analysis.energy import gpu_energy
from rig.analysis.report import build_report
from rig.analysis.runs import load_run
from rig.analysis.schedule import ScheduleError, build_schedule
from rig.analysis.tables import campaign_table
from rig.results import GPU_METRICS_SCHEMA, atomic_write, gpu_metrics_dir

GOLDEN = DATA / "golden" / "run"
OFFSET = 0.25  # server clock - driver clock


def test_counter_delta_is_interpolated_at_the_window_ends():
    ts = np.array([0.0, 1.0, 2.0, 3.0])
    counter = np.array([0.0, 100_000.0, 400_000.0, 500_000.0])  # mJ: 100 W, then 300 W, then 100 W
    power = np.full(4, np.nan)
    assert gpu_energy(ts, counter, power, 0.5, 2.5) == pytest.approx((50 + 300 + 50, "counter"))


def test_power_integral_only_without_a_counter():
    ts = np.array([0.0, 1.0, 2.0, 3.0])
    power = np.array([100_000.0, 100_000.0, 300_000.0, 300_000.0])  # mW
    joules, method = gpu_energy(ts, np.full(4, np.nan), power, 0.0, 3.0)
    assert method == "power_integral" and joules == pytest.approx(100 + 200 + 300)
    # A counter that went back (the driver reloaded) is not trusted either.
    joules, method = gpu_energy(ts, np.array([5e6, 6e6, 1e3, 2e3]), power, 0.0, 3.0)
    assert method == "power_integral"


def test_a_window_the_samples_do_not_span_has_no_energy():
    ts = np.array([1.0, 2.0])
    assert gpu_energy(ts, np.array([0.0, 1000.0]), np.array([1e3, 1e3]), 0.5, 2.0) is None
    assert gpu_energy(ts, np.array([0.0, 1000.0]), np.array([1e3, 1e3]), 1.0, 2.5) is None


def _write_gpu_metrics(run: Path, point: str, a: float, b: float, watts: list[float], counter: bool = True) -> None:
    """Samples as the runner takes them (driver clock; written on the server clock, +OFFSET): every 0.5 s from a-2
    to b+2, one at the common start (a) and the closing one 50 ms after the last end. Each GPU draws 100 W outside
    the window and ``watts`` inside it."""
    rows = []
    times = sorted({*np.arange(a - 2.0, b + 2.0, 0.5).tolist(), a, b + 0.05})
    for gi, w in enumerate(watts):
        energy = 0.0
        prev = a - 2.0
        for t in times:
            inside = max(0.0, min(t, b) - max(prev, a))
            energy += 100.0 * (t - prev - inside) + w * inside
            prev = t
            rows.append(
                {
                    "run_id": "golden",
                    "point": point,
                    "node": "10.0.0.9",
                    "ts": float(t) + OFFSET,
                    "source": "nvml",
                    "gpu_index": gi,
                    "gpu_uuid": f"GPU-{gi}",
                    "gpu_name": "NVIDIA H200",
                    "power_mw": int(w * 1000 if a < t < b else 100_000),
                    "energy_mj": int(round(energy * 1000)) if counter else None,
                }
            )
    atomic_write(gpu_metrics_dir(run, point) / "part-00000.parquet", pa.Table.from_pylist(rows, GPU_METRICS_SCHEMA))


def synthetic(tmp: Path, watts_by_point: dict[str, list[float]], price: float | None = None) -> Path:
    run = tmp / "run"
    shutil.copytree(GOLDEN, run)
    rows = {r["point"]: r for r in campaign_table(run)}
    m = json.loads((run / "manifest.json").read_text())
    for cid in m["server_configs"]:
        m["server_configs"][cid]["telemetry"] = {
            "source": "nvml",
            "gpus": [{"index": 0}, {"index": 1}],
            "clock_offset_s": OFFSET,
        }
    if price is not None:
        m["spec"]["cluster"]["gpu_hour_price"] = price
    m["version"] = 2  # as written now: its verdict stands (version 1 points are judged again on read)
    for p in m["points"]:  # every point valid (the golden run's generator was saturated at one)
        p["flags"], p["flag_reasons"] = [], {}
    (run / "manifest.json").write_text(json.dumps(m))
    for point, watts in watts_by_point.items():
        _write_gpu_metrics(run, point, rows[point]["first_send_ts"], rows[point]["last_end_ts"], watts)
    return run


POINTS = [
    "sim-s0-3ccf22e4-realistic-c2",
    "sim-s0-3ccf22e4-realistic-c4",
    "sim-s4-01a61f00-realistic-c2",
    "sim-s4-01a61f00-realistic-c4",
]


def test_energy_per_point_from_the_counter_on_the_driver_clock(tmp_path):
    run = synthetic(tmp_path, {p: [300.0, 500.0] for p in POINTS}, price=2.0)
    for r in campaign_table(run):
        wall = r["last_end_ts"] - r["first_send_ts"]
        assert r["energy_method"] == "counter" and r["gpus"] == 2 and r["energy_source"] == "nvml"
        # 100 W outside the window: the offset is applied; the closing round 50 ms late costs <= 0.05 s x 600 W
        assert abs(r["energy_j"] - 800.0 * wall) <= 0.05 * 600 + 0.01
        assert r["mean_power_w"] == pytest.approx(r["energy_j"] / wall)
        assert r["j_per_token"] == pytest.approx(r["energy_j"] / r["tokens"])
        assert r["tok_s_per_w"] == pytest.approx(r["aggregate_tok_s"] / r["mean_power_w"])
        assert r["usd_per_mtok"] == pytest.approx(2.0 * 2 * wall / 3600 / r["tokens"] * 1e6)  # the cluster's price
    over = {r["point"]: r for r in campaign_table(run, gpu_hour_price=3.0)}
    r = over[POINTS[0]]
    assert r["usd_per_mtok"] == pytest.approx(3.0 * 2 * r["wall_s"] / 3600 / r["tokens"] * 1e6)  # the flag wins


def test_a_run_without_telemetry_or_price_keeps_its_columns():
    rows = campaign_table(GOLDEN)
    assert "energy_j" not in rows[0] and "usd_per_mtok" not in rows[0]
    rep = build_report(GOLDEN)
    assert not rep.energy and not rep.cost
    with pytest.raises(ScheduleError, match="needs GPU telemetry"):
        build_report(GOLDEN, objective="j_per_token")
    with pytest.raises(ScheduleError, match="needs a GPU-hour price"):
        build_report(GOLDEN, objective="usd_per_mtok")


def test_compare_gives_paired_energy_ratios_with_intervals(tmp_path):
    run = synthetic(
        tmp_path,
        {POINTS[0]: [300.0, 300.0], POINTS[1]: [300.0, 300.0], POINTS[2]: [400.0, 400.0], POINTS[3]: [400.0, 400.0]},
    )
    out = compare(str(run), baseline_steps=0, resamples=400)
    rows = {r["concurrency"]: r for r in out["energy"] if r["metric"] == "j_per_token"}
    table = {r["point"]: r for r in campaign_table(run)}
    for c, (b, s) in {2: (POINTS[0], POINTS[2]), 4: (POINTS[1], POINTS[3])}.items():
        expect = table[s]["j_per_token"] / table[b]["j_per_token"]
        assert rows[c]["ratio"] == pytest.approx(expect)
        assert rows[c]["ci_low"] < expect < rows[c]["ci_high"] and rows[c]["pairs"] > 0
    assert not any(r["metric"] == "usd_per_mtok" for r in out["energy"])  # no price given
    assert "energy" not in compare(str(GOLDEN), baseline_steps=0, resamples=200)  # no telemetry: as before


def test_a_crossover_where_a_setting_has_no_valid_point_is_incomplete():
    r = load_run(GOLDEN)  # steps 4 at C=4 is flagged client_saturated there
    [s] = build_schedule(r, campaign_table(r), None, "throughput")
    [c] = s["crossovers"]
    assert (c["from_steps"], c["to_steps"], c["incomplete"], c["decided"]) == (4, 0, ["steps=4"], False)


def test_schedule_finds_the_crossover_of_the_chosen_objective(tmp_path):
    # steps 4 is faster at both levels; at C=4 it draws so much more that steps 0 spends fewer J per token there.
    run = synthetic(
        tmp_path,
        {POINTS[0]: [300.0, 300.0], POINTS[1]: [300.0, 300.0], POINTS[2]: [400.0, 400.0], POINTS[3]: [3000.0, 3000.0]},
    )
    r = load_run(run)
    rows = campaign_table(r)
    [thr] = build_schedule(r, rows, None, "throughput")
    assert [b["best_steps"] for b in thr["bands"]] == [4, 4] and thr["crossovers"] == []
    assert [(b["level"], b["up_to"]) for b in thr["bands"]] == [(2, 4), (4, None)]
    assert thr["bands"][0]["margin"] == pytest.approx(311.97514076197194 / 120.98677272026492 - 1)
    assert thr["bands"][0]["ci_low"] < thr["bands"][0]["margin"] < thr["bands"][0]["ci_high"]
    [jpt] = build_schedule(r, rows, None, "j_per_token")
    assert [b["best_steps"] for b in jpt["bands"]] == [4, 0]
    [cross] = jpt["crossovers"]
    assert (cross["from_level"], cross["to_level"], cross["from_steps"], cross["to_steps"]) == (2, 4, 4, 0)
    by = {b["level"]: b for b in jpt["bands"]}
    jp = {x["point"]: x["j_per_token"] for x in rows}
    assert by[4]["margin"] == pytest.approx(1 - jp[POINTS[1]] / jp[POINTS[3]])  # lower is better: the saving
    # Under SLOs only passing points count: steps 4 misses at C=4, so its limit is C=2 and C=4 has one candidate.
    meets = {POINTS[0]: True, POINTS[1]: True, POINTS[2]: True, POINTS[3]: False}
    [slo] = build_schedule(r, rows, meets, "throughput")
    assert [b["best_steps"] for b in slo["bands"]] == [4, 0] and slo["bands"][1]["runner_up"] is None
    lim = {e["steps"]: e for e in slo["at_slo_limit"]}
    assert (lim[0]["max_level"], lim[4]["max_level"]) == (4, 2)
    assert lim[4]["j_per_token"] == pytest.approx(jp[POINTS[2]])
    assert lim[4]["mean_power_w"] == pytest.approx(800, rel=1e-2)
