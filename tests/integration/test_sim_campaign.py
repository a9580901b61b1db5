"""Through the real rig path (`rig run` on the sim, greedy workload), the reference profile reproduces the campaign.

The simulated server runs its clock TIME_SCALE times as fast (`--sim-fault slow=F`, F < 1: every engine iteration
takes F times its modelled duration), and the measured rates are scaled back by F before they are compared. The sim
keeps absolute iteration deadlines, so timer jitter does not accumulate; and at 1/F the campaign's rates (a few
thousand tokens/s, under 2,000 streamed events/s at C=64) are still far below what one generator reads (over
100,000 events/s, see the README's benchmarks), so the client does not shape the figures. That takes the test from
about 5.5 minutes of real-time levels to under 2.

The run judges the generators' event-loop lag with a looser limit than a user's run (LOOP_LAG_MS): on a busy 2-core
CI host a generator's loop stalls now and then (a p99 of 52 ms against the default 50 ms, with 11 % CPU, once flagged
a C=64 point and took it out of the schedule), and here the figures themselves are held to the campaign's within
10 %, which is what that flag protects. A point the host still disturbed (the simulator's iterations over 0.1 s late,
a saturated generator: rig's own verdict) is measured again, up to REDO_ATTEMPTS times, with `rig sweep --resume
--redo-disturbed`, as a user would on a shared machine; what is still flagged after that fails the test, and so does
any other flag. This 2-core host, beside the static checks, engine builds or a second Ray lane, does stall the sim:
in one suite run its C=64 iterations ran up to 1.2 s late; in a later one (2026-12-02) 4 of the 10 points were
flagged, 2 of those again, and the second redo left none (187 s for the sweep instead of ~95 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO

from rig.contracts import DISTURBED_FLAGS

TIME_SCALE = 0.25
LOOP_LAG_MS = 250
REDO_ATTEMPTS = 3  # re-runs of the points the host disturbed, if any (rig sweep --resume --redo-disturbed)
CAMPAIGN = yaml.safe_load((REPO / "rig/sim/data/campaign.yaml").read_text())


def _sweep(tmp: Path, steps: str, conc: str) -> dict[tuple[int, int], dict]:
    """`rig sweep` on the sim (greedy), then `rig report --json`: rows keyed by (steps, concurrency)."""
    return _sweep_full(tmp, steps, conc, full=False)[0]


def _sweep_full(tmp: Path, steps: str, conc: str, full: bool = True) -> tuple[dict[tuple[int, int], dict], dict]:
    """The same with `rig report --json-full`: the rows and the whole report (its speculative schedule)."""
    run_id = "s" + steps.replace(",", "-")
    config = tmp / "load.yaml"
    config.write_text(yaml.safe_dump({"load": {"loop_lag_threshold_s": LOOP_LAG_MS / 1e3}}))
    server = ["--server-arg=--sim-fault", f"--server-arg=slow={TIME_SCALE}"]
    _rig("sweep", "--config", str(config), "--workload", "greedy", "--steps", steps, "--concurrency", conc, *server,
         "--out", str(tmp), "--run-id", run_id, "-q")  # fmt: skip
    for _ in range(REDO_ATTEMPTS):
        if not _disturbed(tmp / run_id):
            break
        _rig("sweep", "--resume", str(tmp / run_id), "--redo-disturbed", "-q")
    doc = json.loads(_rig("report", str(tmp / run_id), "--json-full" if full else "--json"))
    campaign = doc["campaign"] if full else doc
    rows = {(int(r["steps"]), int(r["concurrency"])): r for r in campaign}
    flagged = {r["point"]: r.get("flag_reasons") for r in campaign if r["flags"]}
    assert not flagged, flagged
    for r in campaign:  # back to the modelled clock
        for k in ("aggregate_tok_s", "decode_tok_s", "per_request_tok_s"):
            r[k] = r[k] * TIME_SCALE if r.get(k) is not None else None
    return rows, doc


def _rig(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "rig.cli", *args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def _disturbed(run: Path) -> list[str]:
    """The points this host disturbed (a stalled simulator or generator), by the run's own verdict."""
    points = json.loads((run / "manifest.json").read_text())["points"]
    return [p["point"] for p in points if set(p["flags"]) & DISTURBED_FLAGS]


@pytest.mark.slow
def test_rig_run_on_sim_reproduces_campaign(tmp_path):
    # One sweep, two server launches: steps 3 and 4 at the campaign's levels (its table, the C=64 regression and
    # the speculative schedule that turns on it).
    both, report = _sweep_full(tmp_path, "3,4", "1,4,16,32,64")
    s4 = {c: r for (steps, c), r in both.items() if steps == 4}
    s3 = {c: r for (steps, c), r in both.items() if steps == 3}
    for row in CAMPAIGN["steps4_table"]:
        got = s4[int(row["concurrency"])]
        # On a failure the point's flags say whether the host stalled the sim (sim_behind) or its generator.
        why = (row, got["flags"], got.get("flag_reasons"))
        assert got["aggregate_tok_s"] == pytest.approx(row["aggregate_tok_s"], rel=0.10), why
        assert got["decode_tok_s"] == pytest.approx(row["per_request_tok_s"], rel=0.10), why
    assert s4[64]["aggregate_tok_s"] < s3[64]["aggregate_tok_s"]  # the C=64 regression from steps 3 to 4
    _schedule_finds_the_crossover(report, s3, s4)
    base = CAMPAIGN["steps4_table"][0]["per_request_tok_s"] / CAMPAIGN["c1_speedup_vs_steps1"][4]
    low = _sweep(tmp_path, "1,2", "1")  # one sweep, two server launches
    c1 = {4: s4[1], 3: s3[1], 2: low[(2, 1)], 1: low[(1, 1)]}
    for steps, row in c1.items():
        want = base * CAMPAIGN["c1_speedup_vs_steps1"][steps]
        assert row["decode_tok_s"] == pytest.approx(want, rel=0.10), (steps, row["flags"], row.get("flag_reasons"))


def _schedule_finds_the_crossover(report: dict, s3: dict, s4: dict) -> None:
    """The seed's finding, from `rig report`'s speculative schedule: steps 4 is best at C=1, steps 3 at C=64 (the
    campaign: 1,914 vs 1,817 tok/s), with the crossover between; the simulated energy is labelled as such."""
    [sched] = report["schedule"]
    bands = {b["level"]: b for b in sched["bands"]}
    assert bands[1]["best_steps"] == 4 and bands[64]["best_steps"] == 3
    assert bands[64]["runner_up"] == "steps=4" and bands[64]["margin"] > 0 and bands[64]["ci_low"] is not None
    assert sched["crossovers"] and sched["crossovers"][-1]["to_steps"] == 3
    assert sched["crossovers"][-1]["to_level"] <= 64 and sched["crossovers"][0]["from_steps"] == 4
    limits = {e["steps"]: e for e in sched["at_slo_limit"]}
    assert limits[3]["max_level"] == limits[4]["max_level"] == 64
    assert limits[3]["energy_source"] == "simulated" and limits[3]["j_per_token"] > 0
    for r in (*s3.values(), *s4.values()):
        assert r["energy_source"] == "simulated" and r["energy_method"] == "counter" and r["gpus"] == 4
    assert any("SIMULATED" in line for line in report["telemetry"])
