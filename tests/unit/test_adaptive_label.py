"""An adaptive server's points are labelled with its candidate table, read as SGLang reads it, not as fixed steps."""

from __future__ import annotations

import json

import pytest

from rig.analysis import compare as cmp
from rig.analysis.runs import load_run
from rig.config import SpecError, build_spec
from rig.contracts.adaptive import AdaptiveTableError, read_config_file, slot_for_batch, steps_refusal
from rig.server.adaptive import adaptive_table
from rig.server.spec import ServerConfig
from tests.synthetic import greedy_rows, point_entry, write_requests, write_run


def test_config_file_is_read_as_sglang_reads_it(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"ema_alpha": 0.3, "1": {"candidate_steps": [3, 1, 3]}, "16": {"candidate_steps": [0]}}))
    assert read_config_file(f) == {"1": [1, 3], "16": [0]}  # shared settings skipped, candidates sorted
    f.write_text(json.dumps({"1": {"candidate_steps": [-1]}}))
    with pytest.raises(AdaptiveTableError, match="BS 1: candidate_steps must be a list of non-negative ints"):
        read_config_file(f)
    f.write_text(json.dumps({"strategy": "ema"}))
    with pytest.raises(AdaptiveTableError, match="at least one integer-string BS key"):
        read_config_file(f)
    assert steps_refusal(4, {"1": [1, 3], "16": [0]}) is not None and steps_refusal(3, {"1": [1, 3]}) is None


def test_batch_routes_to_the_largest_slot_after_graph_padding():
    slots = {"1": [1], "8": [3], "32": [0]}
    assert [slot_for_batch(b, slots) for b in (1, 7, 8, 31, 32, 100)] == ["1", "1", "8", "8", "32", "32"]
    # 31 pads to the graph size 32 first, so it runs slot 32's candidates
    assert slot_for_batch(31, slots, [1, 2, 4, 8, 16, 32]) == "32"


def test_table_from_the_launch_and_server_info(tmp_path):
    cfg = ServerConfig(engine="sglang", steps=3, spec_algorithm="EAGLE", extra_args=("--speculative-adaptive",))
    table, warn = adaptive_table(cfg, {"speculative_adaptive": True, "version": "0.5.17", "speculative_num_steps": 3})
    assert table is not None and not warn
    assert table.slots["1"] == [1, 3, 7] and table.startup_steps == 3 and "0.5.17" in table.source
    assert table.describe() == "1:[1,3,7] 8:[0,1,3] 32:[0,1] 64:[0]"
    table, _ = adaptive_table(cfg, {"speculative_adaptive": True})
    assert table is not None and table.slots["1"] == [1, 3, 5, 7] and "assumed" in str(table.note)
    off, warn = adaptive_table(cfg, {"speculative_adaptive": False})
    assert off is None and "speculative_adaptive=False" in warn[0]
    assert adaptive_table(ServerConfig(engine="sglang", steps=3), {"speculative_num_steps": 3}) == (None, [])
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"1": {"candidate_steps": [2, 4]}}))
    table, _ = adaptive_table(cfg, {"speculative_adaptive": True, "speculative_adaptive_config": str(f)})
    assert table is not None and table.slots == {"1": [2, 4]} and table.config_file == str(f)


def test_spec_time_reads_the_config_file(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    base = {"engine": "sglang", "spec_algorithm": "EAGLE"}
    args = ["--speculative-adaptive", "--speculative-adaptive-config", str(f)]
    build_spec(None, {"server": {**base, "extra_args": args}, "steps": [3]})
    with pytest.raises(SpecError, match=r"num-steps 4 is not among the adaptive candidate steps \[1, 3\]"):
        build_spec(None, {"server": {**base, "extra_args": args}, "steps": [4]})
    # without a file, the default table: steps 4 is a candidate of no SGLang version
    with pytest.raises(SpecError, match=r"num-steps 4 is not among .* of SGLang's default table"):
        build_spec(None, {"server": {**base, "extra_args": ["--speculative-adaptive"]}, "steps": [4]})
    build_spec(None, {"server": {**base, "extra_args": ["--speculative-adaptive"]}, "steps": [3]})
    f.write_text("{")
    with pytest.raises(SpecError, match="is not JSON"):
        build_spec(None, {"server": {**base, "extra_args": args}, "steps": [3]})


def test_adaptive_point_is_labelled_with_its_start_not_as_fixed(tmp_path):
    table = {"slots": {"1": [1, 3, 5, 7], "8": [0, 1, 3]}, "startup_steps": 3, "source": "SGLang default table"}
    manifest = {
        "run_id": "a",
        "status": "complete",
        "server_configs": {"cfg3": {"engine": "sglang", "adaptive": table}, "cfg1": {"engine": "sglang"}},
        "points": [point_entry("p3", 3), point_entry("p1", 1)],
    }
    run_dir = write_run(tmp_path / "run", manifest)
    for p, s in (("p3", 3), ("p1", 1)):
        write_requests(run_dir, p, 0, greedy_rows(p, s, [0.05], [1.0], 100))
    run = load_run(run_dir)
    labels = {p.point: cmp.config_label(cmp.Side(run, p, p.point)) for p in run.points}
    assert labels == {"p3": "adaptive(start steps=3)", "p1": "steps=1"}


def test_the_verdict_names_an_adaptive_setting_as_the_schedule_does(tmp_path):
    from rig.analysis.report import build_report
    from rig.analysis.verdict import setting_labels

    table = {"slots": {"1": [1, 3]}, "startup_steps": 3, "source": "config file a.json"}
    manifest = {
        "run_id": "a",
        "status": "complete",
        "server_configs": {"cfg3": {"engine": "sglang", "adaptive": table}, "cfg1": {"engine": "sglang"}},
        "points": [point_entry("p3", 3), point_entry("p1", 1)],
    }
    run_dir = write_run(tmp_path / "run", manifest)
    for p, s in (("p3", 3), ("p1", 1)):
        write_requests(run_dir, p, 0, greedy_rows(p, s, [0.05] * 3, [1.0, 1.1, 1.2], 100))
    rep = build_report(run_dir)
    labels = setting_labels(rep.campaign, rep.run)
    assert labels == {"cfg3": "adaptive(start steps=3)", "cfg1": "steps=1"}
    assert {b["best"] for s in rep.schedule for b in s["bands"]} <= set(labels.values())


def test_rig_query_server_configs_carry_the_table(tmp_path):
    from rig.analysis.query import server_configs_table

    table = {"slots": {"1": [1, 3]}, "startup_steps": 3, "source": "config file a.json"}
    manifest = {
        "run_id": "a",
        "server_configs": {"cfg3": {"engine": "sglang", "adaptive": table}, "cfg1": {}},
        "points": [point_entry("p3", 3)],
    }
    run_dir = write_run(tmp_path / "run", manifest)
    write_requests(run_dir, "p3", 0, greedy_rows("p3", 3, [0.05], [1.0], 100))
    rows = server_configs_table([load_run(run_dir)], ["a"]).to_pylist()
    adaptive = {r["server_config"]: r["adaptive"] for r in rows}
    assert adaptive["cfg1"] is None and json.loads(adaptive["cfg3"])["slots"] == {"1": [1, 3]}
