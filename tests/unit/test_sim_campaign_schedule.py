"""The seed's finding, on the simulator's virtual clock: the campaign's levels for steps 3 and 4, simulated by the
same scheduler, cost and capacity code the server runs, written as a run directory, and `rig report`'s speculative
schedule read from it: steps 4 best at C=1, steps 3 at C=64, one crossover between. No host load can move these
numbers (the real-time path is covered, for its bookkeeping, by tests/integration/test_sim_campaign.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import point_entry, record, write_requests, write_run

from rig.analysis.runs import load_run
from rig.analysis.schedule import build_schedule
from rig.analysis.tables import campaign_table
from rig.sim.fit import campaign_flags, campaign_targets
from rig.sim.profile import load_profile
from rig.sim.virtual import Scenario, engine_config, run_closed_loop, summarize

LEVELS = (1, 4, 16, 32, 64)


def _scenario(steps: int, conc: int) -> Scenario:
    """The campaign client's level: the scenario its fit target uses (steps 4's table, same prompts and lengths)."""
    table = {t.scenario.concurrency: t.scenario for t in campaign_targets() if t.scenario and t.scenario.steps == 4}
    base = table[conc]
    return Scenario(
        steps,
        conc,
        base.n_requests,
        base.output_tokens,
        base.prompts,
        label=f"steps{steps} C={conc}",
        state_flags=base.state_flags,  # the campaign's assumed launch flags (rig/sim/data/campaign.yaml)
    )


def _virtual_run(tmp: Path) -> tuple[Path, dict[tuple[int, int], dict]]:
    prof = load_profile()
    points, figures = [], {}
    configs = {}
    for steps in (3, 4):
        cfg = engine_config(prof, steps, state_flags=campaign_flags())
        configs[f"cfg{steps}"] = {
            "engine": "sim",
            "knobs": {"engine": "sim", "model": "m", "tp": 4, "steps": steps, "num_draft_tokens": steps + 1},
            "startup": {"max_total_num_tokens": cfg.kv_pool_tokens, "max_running_requests": cfg.max_running},
        }
        for conc in LEVELS:
            name = f"sim-s{steps}-greedy-c{conc}"
            level = run_closed_loop(prof, _scenario(steps, conc))
            figures[(steps, conc)] = summarize(level)
            rows = [
                record(point=name, steps=steps, workload="greedy", load_mode="closed", concurrency=conc, repeat=0,
                       generator=0, clock_offset_s=0.0, request_id=f"r{i}", send_ts=1000.0 + r.send,
                       first_token_ts=1000.0 + r.first_token, end_ts=1000.0 + r.end, ttft_s=r.ttft, e2e_s=r.e2e,
                       completion_tokens=r.completion_tokens, spec_verify_ct=r.verify_ct, status="ok", ok=True,
                       temperature=0.0, output_hash=f"h{i}")
                for i, r in enumerate(level.requests)
            ]  # fmt: skip
            points.append(point_entry(name, steps, conc, server_config=f"cfg{steps}", requests_scheduled=len(rows),
                                      records={"ok": len(rows), "failed": 0, "cancelled": 0}))  # fmt: skip
            write_requests(tmp, name, 0, rows)
    write_run(tmp, {"run_id": "virtual", "status": "complete", "server_configs": configs, "points": points})
    return tmp, figures


@pytest.fixture(scope="module")
def virtual(tmp_path_factory):
    return _virtual_run(tmp_path_factory.mktemp("virtual") / "run")


def test_the_report_reads_back_the_virtual_figures(virtual):
    run, figures = virtual
    rows = {(r["steps"], r["concurrency"]): r for r in campaign_table(run)}
    for key, fig in figures.items():
        assert rows[key]["aggregate_tok_s"] == pytest.approx(fig["aggregate_tok_s"], rel=1e-9)
        assert rows[key]["accept_length"] == pytest.approx(fig["accept_length"], rel=1e-9)
    assert figures[(4, 64)]["aggregate_tok_s"] < figures[(3, 64)]["aggregate_tok_s"]  # the C=64 regression


def test_schedule_finds_the_campaigns_crossover(virtual):
    run, _ = virtual
    r = load_run(run)
    [sched] = build_schedule(r, campaign_table(r), None, "throughput")
    bands = {b["level"]: b for b in sched["bands"]}
    assert bands[1]["best_steps"] == 4 and bands[64]["best_steps"] == 3
    assert bands[64]["runner_up"] == "steps=4" and bands[64]["margin"] > 0 and bands[64]["ci_low"] is not None
    assert sched["crossovers"] and sched["crossovers"][-1]["to_steps"] == 3
    assert sched["crossovers"][-1]["to_level"] <= 64 and sched["crossovers"][0]["from_steps"] == 4
