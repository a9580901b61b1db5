"""End to end on the embedded default: `rig run` (local Ray + the simulated SGLang server) through the CLI."""

import json
import re

import psutil
import pytest
from accounting import assert_accounting
from support import rig

from rig.results import read_manifest, read_requests, read_server_metrics

pytestmark = pytest.mark.ray

ARGS = [
    "--workload",
    "realistic",
    "--steps",
    "2",
    "--concurrency",
    "1,3",
    "--requests",
    "4",
    "--workload-opt",
    "max_tokens=24",
    "--warmup",
    "1",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    proc = rig("run", *ARGS, "--out", str(out), "--run-id", "e2e")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "e2e", proc


def test_one_ok_row_per_request_with_server_token_counts(run):
    run_dir, proc = run
    assert "live ·" not in proc.stderr  # not a terminal: the progress bars as before, no live panel
    t = read_requests(run_dir).to_pandas()
    m = read_manifest(run_dir)
    assert m["status"] == "complete"
    assert len(t) == 8 and t.ok.all() and t.request_id.groupby(t.point).apply(lambda s: s.is_unique).all()
    assert sorted(t.concurrency.unique()) == [1, 3]
    assert_accounting(run_dir)
    for p in m["points"]:
        assert p["status"] == "complete" and p["requests_scheduled"] == 4 == p["records"]["ok"]
        rows = t[t.point == p["point"]]
        # the Parquet's tokens are what the server counted: its own counter rose by exactly that much
        assert rows.completion_tokens.sum() == p["server_counters_delta"]["sglang:generation_tokens_total"]
        assert p["window_acceptance"]["accept_length"] > 1.0
    assert (t.completion_tokens == t.chunk_tokens.apply(sum)).all()
    assert (t.completion_tokens <= 24).all() and (t.temperature == 0.7).all() and (~t.ignore_eos).all()
    assert (t.steps == 2).all() and (t.engine == "sim").all() and (t.api == "sglang-native").all()
    assert t.spec_verify_ct.notna().all()
    assert (t.spec_accept_length - t.completion_tokens / t.spec_verify_ct).abs().max() < 1e-9


def test_the_manifest_is_the_current_version_with_the_runs_thresholds_and_verdict(run):
    from rig.contracts import MANIFEST_VERSION, Thresholds, judge_point
    from rig.contracts.validity import JUDGED_FLAGS
    from rig.results import load_manifest

    run_dir, _ = run
    raw = read_manifest(run_dir)
    assert raw["version"] == MANIFEST_VERSION and raw["thresholds"] == Thresholds().model_dump()
    m = load_manifest(run_dir)  # validates
    for p in m.points:
        assert p.identity() is not None and len(p.generators) == 1 and p.generators[0].window_s > 0
        # the verdict recorded is judge_point's over the generators' reports, with the recorded thresholds (the
        # executor adds others: sim_behind from the simulator's own clock, itl_read_bound from the chunk gaps)
        judged = {k: v for k, v in p.flag_reasons.items() if k in JUDGED_FLAGS}
        assert judged == judge_point(p.load_mode, p.generators, m.thresholds)
        assert p.flags == sorted(p.flag_reasons)


def test_client_timings_agree_with_the_servers_own(run):
    run_dir, _ = run
    t = read_requests(run_dir).to_pandas()
    assert t.server_received_ts.notna().all() and t.server_first_token_ts.notna().all()
    server_ttft = t.server_first_token_ts - t.server_received_ts
    server_e2e = t.server_finished_ts - t.server_received_ts
    # the client measures from just before its send, the server from receipt: the client's figures are a little
    # larger (HTTP on loopback, parsing), never smaller beyond clock granularity
    # How much larger depends on the host: on a busy one (rig flags its point sim_behind or client_saturated) the
    # loop that reads the response may run late by a second; the lower bound holds on any host.
    for client, server in ((t.ttft_s, server_ttft), (t.e2e_s, server_e2e)):
        gap = client - server
        assert gap.min() > -0.002 and gap.median() < 2.0 and gap.max() < 10.0, gap.describe()


def test_manifest_records_server_and_placement(run):
    run_dir, _ = run
    m = read_manifest(run_dir)
    (cfg,) = m["server_configs"].values()
    cmd = cfg["command"]
    assert cmd[1:3] == ["-m", "rig.sim"]
    i = cmd.index("--speculative-num-steps")
    assert cmd[i : i + 6] == [
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
    ]
    assert cfg["server_info"]["max_total_num_tokens"] > 0
    assert (
        cfg["startup"]["max_running_requests"] == cfg["server_info"]["max_running_requests"]
        or cfg["startup"]["max_running_requests"] > 0
    )
    assert cfg["stopped"] is True
    assert m["cluster"]["local"] is True and len(m["cluster"]["generators"]) == 1
    assert all(p["flush_cache"]["status"] == 200 for p in m["points"])
    assert (run_dir / "logs").rglob("server.log")
    names = set(read_server_metrics(run_dir, columns=["name"]).column("name").to_pylist())
    assert {"sglang:num_running_reqs", "sglang:generation_tokens_total"} <= names


def _table_rows(stdout: str) -> list[list[str]]:
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) > 5 and re.fullmatch(r"\d+", cells[0] or ""):
            rows.append(cells)
    return rows


def test_printed_table_equals_report_json(run):
    run_dir, proc = run
    rep = rig("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    printed = _table_rows(proc.stdout)
    assert len(printed) == len(data) == 2
    for cells, row in zip(printed, sorted(data, key=lambda r: r["concurrency"]), strict=False):
        assert int(cells[0]) == row["concurrency"]
        shown = [float(c.replace(",", "")) for c in cells[1:8] if re.fullmatch(r"[\d,.]+", c)]
        expected = [
            row["aggregate_tok_s"],
            row["per_request_tok_s"],
            row["decode_tok_s"],
            row["tokens"],
            row["wall_s"],
            row["ok"],
            row["failed"],
        ]
        assert shown == pytest.approx(expected, rel=0.01, abs=0.051)


def test_no_engine_process_left(run):
    run_dir, _ = run
    (cfg,) = read_manifest(run_dir)["server_configs"].values()
    ours = " ".join(cfg["command"])  # this run's exact engine command line (its port is unique)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []) == ours]
    assert cfg["command"] and leftovers == []
