"""Analysis on a hand-built run: every campaign column, percentiles, ITL, acceptance, goodput, losslessness."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic import record, write_requests, write_run, write_server_metrics

from rig.analysis import metrics as m
from rig.analysis.lossless import check_lossless
from rig.analysis.report import build_report
from rig.analysis.runs import load_run
from rig.analysis.tables import campaign_table

# Generator 1's clock runs 2 s ahead of the driver's: its timestamps must be shifted back by 2 s.
OFFSET_G1 = 2.0


def _rows(point: str, steps: int, verify: tuple[int | None, int | None] = (None, None), hash_b: str = "hb"):
    base = dict(
        run_id="r1",
        point=point,
        engine="sim",
        workload="greedy",
        steps=steps,
        server_config=f"cfg{steps}",
        load_mode="closed",
        concurrency=2,
        repeat=0,
        temperature=0.0,
        ignore_eos=True,
    )
    a = record(
        **base,
        generator=0,
        clock_offset_s=0.0,
        request_id="a",
        send_ts=100.0,
        first_token_ts=100.5,
        end_ts=102.5,
        ttft_s=0.5,
        e2e_s=2.5,
        chunk_offsets_s=[0.5, 1.5, 2.5],
        chunk_tokens=[1, 5, 5],
        completion_tokens=11,
        status="ok",
        ok=True,
        spec_verify_ct=verify[0],
        output_hash="ha",
    )
    c = record(
        **base,
        generator=0,
        clock_offset_s=0.0,
        request_id="c",
        send_ts=100.2,
        end_ts=100.5,
        e2e_s=0.3,
        status="failed",
        ok=False,
        error="boom",
        http_status=500,
    )
    b = record(
        **base,
        generator=1,
        clock_offset_s=OFFSET_G1,
        request_id="b",
        send_ts=101.5,
        first_token_ts=102.5,
        end_ts=105.5,
        ttft_s=1.0,
        e2e_s=4.0,
        chunk_offsets_s=[1.0, 2.0, 4.0],
        chunk_tokens=[1, 10, 20],
        completion_tokens=31,
        status="ok",
        ok=True,
        spec_verify_ct=verify[1],
        output_hash=hash_b,
    )
    return [a, c], [b]


def _point(point: str, steps: int, **kw):
    return {
        "point": point,
        "server_config": f"cfg{steps}",
        "engine": "sim",
        "workload": "greedy",
        "steps": steps,
        "load_mode": "closed",
        "concurrency": 2,
        "rate": None,
        "repeat": 0,
        "status": "complete",
        "requests_scheduled": 3,
        "records": {"ok": 2, "failed": 1, "cancelled": 0},
        "flags": [],
        "window_acceptance": None,
        "generators": [{"generator": 0, "status": "complete"}, {"generator": 1, "status": "complete"}],
        **kw,
    }


def _config(steps: int) -> dict:
    return {
        "engine": "sim",
        "knobs": {
            "engine": "sim",
            "model": "m",
            "tp": 4,
            "steps": steps,
            "num_draft_tokens": steps + 1 if steps else None,
        },
        "server_info": {"internal_states": [{"effective_max_running_requests_per_dp": 26 - 3 * steps}]},
        "startup": {"max_total_num_tokens": 100000, "max_running_requests": 26},
    }


def make_run(d: Path) -> Path:
    """The hand-built run: four points (steps 0, 2, 3, 4) of the same three requests on two generators."""
    manifest = {
        "run_id": "r1",
        "status": "complete",
        "cluster": {
            "generators": [{"generator": 0, "clock_offset_s": 0.0}, {"generator": 1, "clock_offset_s": OFFSET_G1}]
        },
        "server_configs": {f"cfg{s}": _config(s) for s in (0, 2, 3, 4)},
        "points": [
            _point("p-s0", 0),
            _point("p-s2", 2),
            _point("p-s3", 3, window_acceptance={"accept_length": 3.5}),
            _point("p-s4", 4),
        ],
    }
    write_run(d, manifest)
    for point, steps, verify, hb in (
        ("p-s0", 0, (None, None), "hb"),
        ("p-s2", 2, (5, 10), "hb-DIFFERENT"),
        ("p-s3", 3, (None, None), "hb"),
        ("p-s4", 4, (None, None), "hb"),
    ):
        g0, g1 = _rows(point, steps, verify, hb)
        write_requests(d, point, 0, g0)
        write_requests(d, point, 1, g1)
    samples = []
    for i, (gen, ver, run0, run1, q) in enumerate([(1000, 100, 3, 2, 0), (1200, 150, 7, 7, 4), (1400, 200, 8, 6, 2)]):
        ts = 1000.0 + i
        samples += [
            {"ts": ts, "name": "sglang:generation_tokens_total", "value": float(gen)},
            {"ts": ts, "name": "sglang:spec_verify_calls_total", "value": float(ver)},
            # two DP ranks: running requests add up across label sets
            {"ts": ts, "name": "sglang:num_running_reqs", "labels": '{"dp_rank": "0"}', "value": float(run0)},
            {"ts": ts, "name": "sglang:num_running_reqs", "labels": '{"dp_rank": "1"}', "value": float(run1)},
            {"ts": ts, "name": "sglang:num_queue_reqs", "value": float(q)},
            {"ts": ts, "name": "sglang:token_usage", "value": 0.25 * (i + 1)},
        ]
    write_server_metrics(d, "p-s4", samples)
    return d


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("run"))


def _row(rows, point):
    return next(r for r in rows if r["point"] == point)


def test_campaign_columns_with_offset_correction(run_dir):
    row = _row(campaign_table(run_dir), "p-s0")
    # Driver clock: a 100.0..102.5, c 100.2..100.5, b (101.5..105.5) - 2 = 99.5..103.5 -> window 99.5..103.5
    assert row["wall_s"] == pytest.approx(4.0)
    assert row["tokens"] == 42
    assert row["aggregate_tok_s"] == pytest.approx(42 / 4.0)
    assert row["per_request_tok_s"] == pytest.approx((11 / 2.5 + 31 / 4.0) / 2)
    assert row["decode_tok_s"] == pytest.approx((10 / 2.0 + 30 / 3.0) / 2)
    assert (row["ok"], row["failed"], row["cancelled"], row["requests"]) == (2, 1, 0, 3)
    assert row["accept_length"] is None and row["accept_source"] is None
    assert (row["steps"], row["workload"], row["concurrency"], row["rate"]) == (0, "greedy", 2, None)
    assert row["flags"] == ["has_failures"]


def test_offsets_from_manifest_when_rows_lack_them(tmp_path):
    write_run(
        tmp_path,
        {
            "run_id": "x",
            "status": "complete",
            "points": [_point("p", 0)],
            "cluster": {"generators": [{"generator": 1, "clock_offset_s": OFFSET_G1}]},
        },
    )
    g0, g1 = _rows("p", 0)
    for r in g0 + g1:
        r["clock_offset_s"] = None
    write_requests(tmp_path, "p", 0, g0)
    write_requests(tmp_path, "p", 1, g1)
    assert _row(campaign_table(tmp_path), "p")["wall_s"] == pytest.approx(4.0)


def test_token_weighted_acceptance(run_dir):
    row = _row(campaign_table(run_dir), "p-s2")
    assert row["accept_length"] == pytest.approx(42 / 15)  # not the mean of 11/5 and 31/10
    assert row["accept_source"] == "requests"


def test_acceptance_both_ways_named(run_dir):
    """rig's per-request figure counts each request's prefill token (42 / 15); SGLang's bench_serving prints the
    decode-only server average, (11 - 1 + 31 - 1) / 15: the report gives both, each named."""
    from rich.console import Console

    from rig.analysis.render import render_acceptance

    row = next(r for r in build_report(run_dir).acceptance if r["point"] == "p-s2")
    assert row["from_requests"] == pytest.approx(42 / 15)
    assert row["decode_only"] == pytest.approx(40 / 15)
    console = Console(width=250, record=True)
    console.print(render_acceptance([row]))
    text = console.export_text()
    assert "Decode-only" in text and "2.667" in text and "2.800" in text
    assert "the figure SGLang's bench_serving prints" in text


def test_acceptance_fallbacks(run_dir):
    rows = campaign_table(run_dir)
    assert (_row(rows, "p-s3")["accept_length"], _row(rows, "p-s3")["accept_source"]) == (3.5, "manifest_window")
    # counters: (1400 - 1000) / (200 - 100)
    assert _row(rows, "p-s4")["accept_length"] == pytest.approx(4.0)
    assert _row(rows, "p-s4")["accept_source"] == "server_counters"


def test_itl_spreads_chunk_gaps_over_tokens():
    import pyarrow as pa

    offs = pa.array([[0.5, 1.5, 2.5], [1.0, 2.0, 4.0], None, [0.3]], pa.list_(pa.float64()))
    toks = pa.array([[1, 5, 5], [1, 10, 20], None, [7]], pa.list_(pa.int32()))
    v, w = m.itl_values(offs, toks)
    assert sorted(zip(v.round(12), w, strict=False)) == [(0.1, 10), (0.1, 20), (0.2, 5), (0.2, 5)]
    expanded = np.repeat(v, w.astype(int))
    assert m.summarize(v, w).p50 == pytest.approx(np.percentile(expanded, 50))
    got = m.weighted_percentiles(v, w, [0, 25, 75, 90, 99, 100])
    assert got == pytest.approx(list(np.percentile(expanded, [0, 25, 75, 90, 99, 100])))
    assert m.summarize(v, w).mean == pytest.approx(5 / 40)


def test_weighted_percentiles_match_expanded_array():
    rng = np.random.default_rng(0)
    v, w = rng.random(50), rng.integers(1, 6, 50)
    qs = [0, 1, 33.3, 50, 90, 95, 99, 100]
    assert m.weighted_percentiles(v, w, qs) == pytest.approx(list(np.percentile(np.repeat(v, w), qs)))


def test_latency_percentiles(run_dir):
    rep = build_report(run_dir)
    lat = {r["metric"]: r for r in rep.latency if r["point"] == "p-s0"}
    assert lat["ttft"]["n"] == 2
    assert lat["ttft"]["p50_ms"] == pytest.approx(750.0)
    assert lat["ttft"]["p90_ms"] == pytest.approx(950.0)
    assert lat["ttft"]["p99_ms"] == pytest.approx(995.0)
    assert lat["e2e"]["mean_ms"] == pytest.approx(3250.0)
    assert lat["tpot"]["p50_ms"] == pytest.approx(150.0)  # 0.2 and 0.1 s
    assert lat["itl"]["n"] == 40  # tokens after each request's first chunk
    assert lat["itl"]["p50_ms"] == pytest.approx(100.0)
    assert lat["itl"]["p90_ms"] == pytest.approx(200.0)
    assert lat["itl"]["mean_ms"] == pytest.approx(125.0)
    assert "slip" not in lat  # closed loop


def test_goodput(run_dir):
    slos = [m.parse_slo("ttft=800ms"), m.parse_slo("tpot=0.25s")]
    rep = build_report(run_dir, slos=slos)
    g = _row(rep.goodput, "p-s0")
    # a: ttft 0.5, tpot 0.2 -> good; b: ttft 1.0 -> not; c failed -> counted, not good
    assert (g["good"], g["counted"]) == (1, 3)
    assert g["fraction"] == pytest.approx(1 / 3)
    assert g["goodput_req_s"] == pytest.approx(1 / 4.0)
    assert g["goodput_tok_s"] == pytest.approx(11 / 4.0)
    assert _row(rep.campaign, "p-s0")["goodput_tok_s"] == pytest.approx(11 / 4.0)


def test_parse_slo():
    assert m.parse_slo("ttft=500ms").limit_s == pytest.approx(0.5)
    assert m.parse_slo("tpot=50").limit_s == pytest.approx(0.05)
    assert m.parse_slo("e2e=2s").limit_s == pytest.approx(2.0)
    for bad in ("ttft", "foo=1ms", "ttft=fast"):
        with pytest.raises(ValueError):
            m.parse_slo(bad)


def test_lossless_mismatch_detected(run_dir):
    res = check_lossless(load_run(run_dir))
    assert not res["ok"]
    assert res["requests_checked"] == 2  # a and b (c failed)
    [mm] = res["mismatches"]
    assert mm["request_id"] == "b"
    assert mm["steps"] == [0, 2, 3, 4]
    assert mm["hashes"] == {"steps=0": "hb", "steps=2": "hb-DIFFERENT", "steps=3": "hb", "steps=4": "hb"}


def test_server_series_summary(run_dir):
    rep = build_report(run_dir)
    s = _row(rep.server, "p-s4")
    assert s["samples"] == 3
    assert s["running_mean"] == pytest.approx((5 + 14 + 14) / 3)
    assert s["running_max"] == 14
    assert s["queued_mean"] == pytest.approx(2.0) and s["queued_max"] == 4
    assert s["token_usage_max"] == pytest.approx(0.75)
    assert s["max_running_requests"] == 14  # effective (26 - 3*4), not the configured 26
    assert s["at_running_cap"] is True
    assert _row(rep.server, "p-s0")["samples"] == 0


def test_running_cap_is_per_dp_rank(tmp_path):
    """effective_max_running_requests_per_dp is per DP rank (one internal_states entry each, http_server.py), and
    the running gauge sums the ranks: with 2 ranks of 14 the server holds 28, so 14 running is not at the cap."""
    d = make_run(tmp_path / "dp2")
    path = d / "manifest.json"
    data = json.loads(path.read_text())
    data["server_configs"]["cfg4"]["server_info"]["internal_states"] *= 2
    path.write_text(json.dumps(data))
    s = _row(build_report(d).server, "p-s4")
    assert s["running_max"] == 14 and s["max_running_requests"] == 14
    assert s["at_running_cap"] is False


def test_json_round_trip(run_dir):
    from rig.analysis.report import to_json

    rows = json.loads(to_json(campaign_table(run_dir)))
    assert [r["point"] for r in rows] == ["p-s0", "p-s2", "p-s3", "p-s4"]


def _open_loop_run(d: Path, slips: list[float], generators: list[dict] | None = None) -> Path:
    write_run(
        d,
        {
            "run_id": "o",
            "status": "complete",
            "points": [
                {
                    "point": "o1",
                    "server_config": "c",
                    "engine": "sim",
                    "workload": "realistic",
                    "steps": 1,
                    "load_mode": "poisson",
                    "concurrency": None,
                    "rate": 2.0,
                    "repeat": 0,
                    "status": "complete",
                    "flags": [],
                    "generators": generators or [],
                }
            ],
        },
    )
    rows = []
    for i, slip in enumerate(slips):
        intended = 10.0 + i
        rows.append(
            record(
                point="o1",
                generator=0,
                clock_offset_s=0.0,
                request_id=f"o{i}",
                intended_send_ts=intended,
                send_ts=intended + slip,
                slip_s=slip,
                ttft_s=0.1,
                e2e_s=1.0,
                end_ts=intended + slip + 1.0,
                e2e_from_intended_s=1.0 + slip,
                completion_tokens=10,
                status="ok",
                ok=True,
                temperature=0.7,
            )
        )
    write_requests(d, "o1", 0, rows)
    return d


def _slipped(slip_p99_s: float) -> list[dict]:
    """The generator report a run records for an open-loop point (its own p99 send slip)."""
    return [{"generator": 0, "status": "complete", "slip_p99_s": slip_p99_s, "window_s": 3.0}]


def test_open_loop_latency_from_intended_and_slip_flag(tmp_path):
    d = _open_loop_run(tmp_path, [0.0, 0.0, 0.2, 0.0], _slipped(0.194))
    rep = build_report(d)
    row = rep.campaign[0]
    assert row["rate"] == 2.0 and row["concurrency"] is None
    # sends at 10, 11, 12.2, 13 -> 3 intervals over 3 s
    assert row["achieved_rate"] == pytest.approx(1.0)
    assert "schedule_slip" in row["flags"]  # the generator's p99 slip 194 ms > the run's 10 ms
    assert row["flag_reasons"]["schedule_slip"] == "generator 0 send slip p99 194.0 ms (limit 10 ms)"
    lat = {r["metric"]: r for r in rep.latency}
    assert lat["e2e_from_intended"]["p50_ms"] == pytest.approx(1000.0)
    assert lat["e2e_from_intended"]["mean_ms"] == pytest.approx(1050.0)
    assert lat["ttft_from_intended"]["p99_ms"] == pytest.approx(100 + 0.97 * 200)
    assert lat["slip"]["p50_ms"] == pytest.approx(0.0)
    assert lat["slip"]["mean_ms"] == pytest.approx(50.0)
    assert (
        "schedule_slip"
        not in build_report(_open_loop_run(tmp_path / "b", [0.0] * 4, _slipped(0.001))).campaign[0]["flags"]
    )


def test_client_saturation_from_generator_reports(tmp_path):
    gens = [
        {"generator": 0, "status": "complete", "cpu_pct": 97.0, "loop_lag_p99_ms": 3.0},
        {"generator": 1, "status": "partial", "cpu_pct": 20.0},
    ]
    flags = campaign_table(_open_loop_run(tmp_path, [0.0] * 3, gens))[0]["flags"]
    assert {"client_saturated", "generator_partial"} <= set(flags)


def test_lossless_compares_only_configs_differing_in_speculative_knobs(tmp_path):
    def point(name, steps, tp):
        return {
            "point": name,
            "server_config": f"c{steps}{tp}",
            "engine": "sim",
            "workload": "greedy",
            "steps": steps,
            "load_mode": "closed",
            "concurrency": 1,
            "repeat": 0,
            "status": "complete",
        }

    cfgs = {
        f"c{s}{tp}": {"engine": "sim", "knobs": {"engine": "sim", "tp": tp, "steps": s, "eagle_topk": 1}}
        for s, tp in ((0, 4), (3, 4), (0, 2))
    }
    write_run(
        tmp_path,
        {
            "run_id": "l",
            "status": "complete",
            "server_configs": cfgs,
            "points": [point("a", 0, 4), point("b", 3, 4), point("c", 0, 2)],
        },
    )
    for name, h in (("a", "h1"), ("b", "h1"), ("c", "h-other-tp")):  # tp may change numerics: not compared
        write_requests(
            tmp_path,
            name,
            0,
            [record(point=name, request_id="q", ok=True, status="ok", temperature=0.0, output_hash=h)],
        )
    res = check_lossless(load_run(tmp_path))
    assert res["ok"] and res["groups_checked"] == 1 and res["requests_checked"] == 1


def test_unreadable_part_file_is_skipped_with_a_warning(tmp_path):
    d = make_run(tmp_path / "run")
    bad = d / "requests" / "point=p-s0" / "gen=0" / "part-00009.parquet"
    bad.write_bytes(b"PAR1 truncated")
    rep = build_report(d)
    assert _row(rep.campaign, "p-s0")["tokens"] == 42
    assert any("unreadable part file skipped" in w for w in rep.warnings)
