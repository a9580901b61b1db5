"""rig tune's rounds against a hidden server simulated in virtual time: it must reach the exhaustive grid's answer
with at most half of the grid's points, on each of three hidden servers. The grid and every probe tune asks for are
the simulator's model run with the hidden profile on the virtual clock, so the claim is checked on numbers host load
cannot move (the same rounds through Ray and HTTP in real time: tests/integration/test_tune.py)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from rig.analysis import metrics as m
from rig.analysis.slo import evaluate_slos
from rig.config import build_spec
from rig.contracts import Probe, TuneSettings
from rig.run.points import Point
from rig.sim.profile import Profile, load_profile
from rig.sim.virtual import engine_config, run_closed_loop, summarize
from rig.tune.planner import Observation, TunePlanner
from rig.tune.predict import Replay, Verdict, as_requests
from rig.tune.tune import Knowledge
from rig.workloads import build_sessions

STEPS = [0, 2, 4]
LADDER = [1, 2, 4, 8, 16]
SLOS = ["tpot=20ms", "ttft=2000ms"]
PERCENTILE = 50.0


# Hidden servers (their truth never told to tune, which starts from the reference profile), each with another answer
# or another way for the reference's prediction to be wrong:
HIDDEN = {
    # draft forwards 60x slower, acceptance logit 1.0 lower (as tests/integration/test_tune.py): steps 0 up to 16
    "slow-draft": lambda ref: ref.with_values(
        d_fixed_ms=ref.d_fixed_ms * 60, acc_logit_greedy=ref.acc_logit_greedy - 1
    ),
    # per-token compute 3x: every boundary lower than the reference predicts; steps 0 up to 8
    "slow-tokens": lambda ref: ref.with_values(c_tok_ms=ref.c_tok_ms * 3),
    # experts streamed 2x faster, acceptance logit 0.5 higher: speculation pays; steps 2 up to 16
    "fast-experts": lambda ref: ref.with_values(
        t_experts_ms=ref.t_experts_ms * 0.5, acc_logit_greedy=ref.acc_logit_greedy + 0.5
    ),
}


class HiddenServer:
    """What a server running ``profile`` shows at a point: the rig's figures of its requests, simulated."""

    def __init__(self, profile: Profile, spec, slos: list[m.Slo]) -> None:
        self.profile, self.spec, self.slos = profile, spec, slos
        self.replay = Replay(spec.workloads[0], spec.load.seed, {})

    def caps(self, steps: int, tp: int) -> dict[str, int]:
        cfg = engine_config(self.profile, steps, tp)  # the limits it reports at startup
        return {"max_running_requests": cfg.max_running, "max_total_num_tokens": cfg.kv_pool_tokens}

    def measure(self, steps: int, level: int, tp: int) -> tuple[Probe, dict[str, int]]:
        n = self.spec.load.requests_for(level, None)
        # the workload's own requests, EOS honoured: each ends where the model's output stream does
        sc = replace(self.replay.scenario(steps, level, n, self.caps(steps, tp), tp), ignore_eos=False)
        result = run_closed_loop(self.profile, sc)
        s = summarize(result)
        verdict = evaluate_slos(as_requests(result.requests), self.slos, PERCENTILE)
        probe = Probe.make(
            point=f"s{steps}-c{level}",
            steps=steps,
            level=float(level),
            meets=verdict["meets"],
            margin=verdict["margin"],
            per_slo=verdict["per_slo"],
            requests=n,
            aggregate_tok_s=s["aggregate_tok_s"],
            decode_tok_s=s["decode_tok_s"],
            accept_length=s["accept_length"] if steps else None,
            flags=[],
            valid=True,
            mean_ttft_s=s["mean_ttft_s"],
        )
        turns = [t.turns[0] for t in build_sessions(self.replay.workload, seed=self.replay.seed, n_sessions=n)]
        return probe, {turns[r.index].request_id: r.completion_tokens for r in result.requests}


class VirtualTune(TunePlanner):
    """Tune's own rounds, each probe measured on the hidden server in virtual time instead of through a run."""

    def __init__(self, spec, settings: TuneSettings, server: HiddenServer) -> None:
        super().__init__(spec, settings)
        self.server = server
        self.stop_reason = ""

    def observe(self, runner, p: Point) -> Observation:
        probe, lengths = self.server.measure(p.server.steps, int(p.concurrency), p.server.tp)
        return Observation(probe, lengths, self.server.caps(p.server.steps, p.server.tp))

    def conclude(self, runner, stop_reason: str) -> None:
        self.stop_reason = stop_reason


def _answer(configs: list[str], verdicts: dict[tuple[str, int], Verdict]) -> tuple[str | None, int | None]:
    """The most users meeting the SLOs (ties: higher aggregate tok/s there), from measured verdicts alone."""
    return Knowledge(LADDER, configs, verdicts, {}).leader()


@pytest.fixture(scope="module")
def spec():
    return build_spec(
        {},
        {
            "steps": STEPS,
            "workloads": [{"name": "realistic", "max_tokens": 32}],
            "load": {"concurrency": LADDER},
        },
    )


@pytest.mark.parametrize("hidden", sorted(HIDDEN))
def test_tune_reaches_the_hidden_servers_grid_answer_with_at_most_half_of_its_points(spec, hidden):
    slos = [m.parse_slo(t) for t in SLOS]
    server = HiddenServer(HIDDEN[hidden](load_profile()), spec, slos)
    configs = {c.config_id(): c for c in spec.server_configs()}
    grid: dict[tuple[str, int], Verdict] = {}
    for cid, cfg in configs.items():
        for lv in LADDER:
            probe, _ = server.measure(cfg.steps, lv, cfg.tp)
            grid[(cid, lv)] = Verdict(probe.meets, probe.margin, probe.aggregate_tok_s)
    best, top = _answer(list(configs), grid)
    assert best is not None, "the SLO must be reachable for the comparison to mean anything"

    planner = VirtualTune(spec, TuneSettings(slos=SLOS, percentile=PERCENTILE), server)
    runner = SimpleNamespace(manifest=SimpleNamespace(tune=None), save=lambda: None, entry=None, run_dir=None)
    asked = [(p.config_id, p.concurrency) for p in planner(runner)]
    section = planner.section
    assert len(asked) == len(set(asked)), "a point is measured once"
    assert planner.stop_reason.startswith("stable"), planner.stop_reason
    # every probe carries what the model predicted for it beside what was measured
    assert all(p.predicted_margin is not None and p.meets is not None for p in section.probes)
    measured = {(p.server_config, p.level): Verdict(p.meets, p.margin, p.aggregate_tok_s) for p in section.probes}
    assert measured == {k: grid[k] for k in measured}  # tune saw the hidden server's own figures
    assert _answer(list(configs), measured) == (best, top), (asked, best, top)
    assert len(asked) <= len(grid) / 2, asked
    print(f"\n{hidden}: grid {len(grid)} points, steps {configs[best].steps} up to {top}; tune {len(asked)}: {asked}")
