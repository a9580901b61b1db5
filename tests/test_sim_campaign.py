"""Through the real rig path (`rig run` on the sim, greedy workload), the reference profile reproduces the campaign.

The simulated server runs its clock TIME_SCALE times as fast (`--sim-fault slow=F`, F < 1: every engine iteration
takes F times its modelled duration), and the measured rates are scaled back by F before they are compared. The sim
keeps absolute iteration deadlines, so timer jitter does not accumulate; and at 1/F the campaign's rates (a few
thousand tokens/s, under 2,000 streamed events/s at C=64) are still far below what one generator reads (over
100,000 events/s, see the README's benchmarks), so the client does not shape the figures. That takes the test from
about 5.5 minutes of real-time levels to under 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TIME_SCALE = 0.25
CAMPAIGN = yaml.safe_load((Path(__file__).parents[1] / "rig/sim/data/campaign.yaml").read_text())


def _sweep(tmp: Path, steps: str, conc: str) -> dict[tuple[int, int], dict]:
    """`rig sweep` on the sim (greedy), then `rig report --json`: rows keyed by (steps, concurrency)."""
    rig = [sys.executable, "-m", "rig.cli"]
    run_id = "s" + steps.replace(",", "-")
    p = subprocess.run([*rig, "sweep", "--workload", "greedy", "--steps", steps, "--concurrency", conc,
                        "--server-arg=--sim-fault", f"--server-arg=slow={TIME_SCALE}",
                        "--out", str(tmp), "--run-id", run_id, "-q"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = subprocess.run([*rig, "report", str(tmp / run_id), "--json"], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    rows = {(int(r["steps"]), int(r["concurrency"])): r for r in json.loads(rep.stdout)}
    for r in rows.values():  # back to the modelled clock
        for k in ("aggregate_tok_s", "decode_tok_s", "per_request_tok_s"):
            r[k] = r[k] * TIME_SCALE if r.get(k) is not None else None
    return rows


def _run(tmp: Path, steps: int, conc: str) -> dict[int, dict]:
    return {c: r for (_, c), r in _sweep(tmp, str(steps), conc).items()}


@pytest.mark.slow
def test_rig_run_on_sim_reproduces_campaign(tmp_path):
    s4 = _run(tmp_path, 4, "1,4,16,32,64")
    for row in CAMPAIGN["steps4_table"]:
        got = s4[int(row["concurrency"])]
        assert got["aggregate_tok_s"] == pytest.approx(row["aggregate_tok_s"], rel=0.10), row
        assert got["decode_tok_s"] == pytest.approx(row["per_request_tok_s"], rel=0.10), row
    s3 = _run(tmp_path, 3, "1,64")
    assert s4[64]["aggregate_tok_s"] < s3[64]["aggregate_tok_s"]  # the C=64 regression from steps 3 to 4
    base = CAMPAIGN["steps4_table"][0]["per_request_tok_s"] / CAMPAIGN["c1_speedup_vs_steps1"][4]
    low = _sweep(tmp_path, "1,2", "1")  # one sweep, two server launches
    c1 = {4: s4[1], 3: s3[1], 2: low[(2, 1)], 1: low[(1, 1)]}
    for steps, row in c1.items():
        assert row["decode_tok_s"] == pytest.approx(base * CAMPAIGN["c1_speedup_vs_steps1"][steps], rel=0.10), steps
