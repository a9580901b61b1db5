"""rig held to what real SGLang 0.5.17 showed on an H100 (2026-12-07) serving the trained models.

Data: tests/data/h100-2026-12-07 (provenance in tests/data/README.md): the adaptive run directory (EAGLE head,
--speculative-adaptive from tier 7, C=1 and 64), the startup facts of the STANDALONE steps 0-4 and NGRAM servers,
and the sweep's own summary tables as rig printed them there. The expected values are derived here from the raw
data (the gauge samples, the parquet records), not copied from rig's output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.dataset as ds
from support import rig

from rig.server.engines import SGLangAdapter

DAY = Path(__file__).resolve().parents[1] / "data" / "h100-2026-12-07"
ADAPTIVE = DAY / "adaptive-run"


def gauge_samples(point: str) -> list[tuple[float, float]]:
    t = ds.dataset(ADAPTIVE / "server_metrics", format="parquet", partitioning="hive").to_table().to_pandas()
    g = t[(t["name"] == "sglang:spec_num_steps") & (t["point"] == point)].sort_values("ts")
    return list(zip(g["ts"], g["value"], strict=True))


def test_the_real_adaptive_controllers_tier_is_reported_as_the_gauge_moved():
    """Time-weighted active steps per point, each scrape held until the next, recomputed from the raw samples."""
    out = rig("report", str(ADAPTIVE), "--json-full")
    assert out.returncode == 0, out.stderr
    by_point = {a["point"]: a for a in json.loads(out.stdout)["active_steps"]}
    assert set(by_point) == {"sglang-s7-d2134701-greedy-c1", "sglang-s7-d2134701-greedy-c64"}
    for point, a in by_point.items():
        samples = gauge_samples(point)
        spans = [(v, t1 - t0) for (t0, v), (t1, _) in zip(samples, samples[1:], strict=False)]
        mean = sum(v * d for v, d in spans) / sum(d for _, d in spans)
        switches = sum(1 for (_, a_), (_, b_) in zip(samples, samples[1:], strict=False) if a_ != b_)
        assert abs(a["mean"] - mean) < 1e-6
        assert a["switches"] == switches
        assert (a["min"], a["max"]) == (min(v for _, v in samples), max(v for _, v in samples))
        assert a["startup_steps"] == 7 and a["adaptive"].startswith("1:[1,3,7]")  # 0.5.17's default table
    # the controller followed load: a lower tier at C=64 than at C=1
    assert by_point["sglang-s7-d2134701-greedy-c64"]["mean"] < by_point["sglang-s7-d2134701-greedy-c1"]["mean"]


def test_no_request_of_the_real_runs_was_aborted():
    """Every record of the adaptive run is ok: the same request texts on both points, no reused wire ids aborted."""
    t = ds.dataset(ADAPTIVE / "requests", format="parquet", partitioning="hive").to_table().to_pandas()
    assert len(t) == 4 + 128 and t["ok"].all()
    assert set(t["finish_reason"]) == {"length"}  # greedy asks for its max_tokens with ignore_eos
    # the sweep's tables as printed on the device: every point of every server has Failed 0
    for log in ("standalone.log", "ngram.log"):
        rows = [ln for ln in (DAY / log).read_text().splitlines() if re.match(r"│\s+\d+ │", ln)]
        failed = [int(ln.split("│")[8]) for ln in rows]
        assert rows and failed == [0] * len(rows), log


def test_startup_facts_of_the_real_servers():
    """max_running_requests 4,096 plain and 48 under speculation, as rig parsed SGLang's log there."""
    servers = json.loads((DAY / "standalone_servers.json").read_text())["servers"]
    by_steps = {c["knobs"]["steps"]: c["startup"] for c in servers.values()}
    assert sorted(by_steps) == [0, 1, 2, 3, 4]
    assert by_steps[0]["max_running_requests"] == 4096
    assert {by_steps[s]["max_running_requests"] for s in (1, 2, 3, 4)} == {48}
    # the parser agrees with the capacity line the adaptive server logged
    log = next((ADAPTIVE / "logs").rglob("server.log")).read_text(errors="replace")
    facts = dict(SGLangAdapter().parse_startup_log(log))
    manifest = json.loads((ADAPTIVE / "manifest.json").read_text())
    (startup,) = [c["startup"] for c in manifest["server_configs"].values()]
    assert facts == startup and facts["max_running_requests"] == 48
