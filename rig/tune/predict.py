"""The simulator's model as a predictor: replay a load level of the run's own workload in virtual time with a
profile, read the SLO verdict off the simulated requests, and fit the profile to what was measured.

Both the fit and the prediction replay the workload's real requests (the same seeded prompts the generators sent, as
the native API renders them) with the output lengths the server produced for them, and the server limits it reported
at startup (max running requests, KV pool tokens): what the rig can see. What it cannot see (the server's real forward
costs and acceptance) is what the fit estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rig.analysis import metrics as m
from rig.analysis.slo import evaluate_slos
from rig.sim.fit import Target, fit
from rig.sim.profile import Profile
from rig.sim.virtual import RequestResult, Scenario, run_closed_loop, summarize
from rig.workloads import build_sessions
from rig.workloads.base import render_messages
from rig.workloads.spec import WorkloadSpec

# What measurements of a few load levels constrain: forward costs, draft cost, acceptance (capacity is observed).
TUNE_FREE = ("t_fixed_ms", "t_experts_ms", "c_tok_ms", "d_fixed_ms", "acc_logit_greedy")


class PredictError(ValueError):
    """The workload cannot be replayed by the model (one line)."""


@dataclass
class Replay:
    """The workload's requests as the server saw them: rendered prompts, and the output length of each request id
    (measured), for the lengths of requests not measured yet the measured ones cycled."""

    workload: WorkloadSpec
    seed: int
    lengths: dict[str, int]  # request_id -> completion tokens the server produced

    def scenario(self, steps: int, concurrency: int, n: int, caps: dict[str, int] | None, tp: int) -> Scenario:
        sessions = build_sessions(self.workload, seed=self.seed, n_sessions=n)
        if any(len(s.turns) != 1 for s in sessions):
            raise PredictError(f"tune replays single-turn workloads; {self.workload.name} has multi-turn sessions")
        turns = [s.turns[0] for s in sessions]
        known = list(self.lengths.values()) or [t.max_tokens for t in turns]
        lengths = tuple(self.lengths.get(t.request_id, known[i % len(known)]) for i, t in enumerate(turns))
        temps = {t.temperature for t in turns}
        caps = caps or {}
        return Scenario(
            steps,
            concurrency,
            n,
            lengths,
            tuple(render_messages(list(t.messages)) for t in turns),
            temperature=max(temps),
            ignore_eos=True,
            tp=tp,
            seed=self.seed,
            label=f"s{steps} C={concurrency}",
            max_running=caps.get("max_running_requests"),
            kv_pool_tokens=caps.get("max_total_num_tokens"),
        )


def as_requests(results: list[RequestResult]) -> m.Requests:
    """Simulated requests as the metric arrays the analysis uses (so the SLO verdict has one definition)."""
    n = len(results)
    nan = np.full(n, np.nan)
    return m.Requests(
        ok=np.ones(n, bool),
        cancelled=np.zeros(n, bool),
        tokens=np.array([r.completion_tokens for r in results], float),
        ttft=np.array([r.ttft for r in results]),
        e2e=np.array([r.e2e for r in results]),
        send=np.array([r.send for r in results]),
        end=np.array([r.end for r in results]),
        slip=nan,
        e2e_from_intended=nan,
        verify_ct=np.array([r.verify_ct for r in results], float),
    )


@dataclass(frozen=True)
class Verdict:
    """A level's SLO verdict, measured or predicted: meets, margin (headroom of the tightest SLO), throughput."""

    meets: bool
    margin: float | None = None
    aggregate_tok_s: float | None = None


@dataclass(frozen=True)
class Prediction(Verdict):
    """One level as the model predicts it."""

    decode_tok_s: float | None = None
    accept_length: float | None = None
    max_running: float | None = None


@dataclass
class FitPoint:
    """A measured point the profile is fitted to, with the scenario that replays it."""

    point: str
    server_config: str
    level: int
    aggregate_tok_s: float | None  # None: no request of the point succeeded
    decode_tok_s: float | None = None
    mean_ttft_s: float | None = None
    accept_length: float | None = None
    scenario: Scenario | None = None  # set before each refit (the lengths and limits known by then)


def predict(profile: Profile, sc: Scenario, slos: list[m.Slo], percentile: float) -> Prediction:
    """One level simulated: SLO verdict and margin, aggregate and decode tok/s."""
    level = run_closed_loop(profile, sc)
    summary = summarize(level)
    verdict = evaluate_slos(as_requests(level.requests), slos, percentile)
    return Prediction(
        meets=verdict["meets"],
        margin=verdict["margin"],
        aggregate_tok_s=summary["aggregate_tok_s"],
        decode_tok_s=summary["decode_tok_s"],
        accept_length=summary["accept_length"],
        max_running=summary["max_running"],
    )


def targets(measured: list[FitPoint]) -> list[Target]:
    """Fit targets of measured points: aggregate and decode tok/s, mean TTFT, acceptance length."""
    out = []
    for p in measured:
        sc = p.scenario
        assert sc is not None, f"{p.point}: no scenario to replay it"
        label = f"{p.point}"
        if p.aggregate_tok_s is not None:
            out.append(Target(f"{label} aggregate", "aggregate_tok_s", p.aggregate_tok_s, sc))
        if p.decode_tok_s:
            out.append(Target(f"{label} decode", "decode_tok_s", p.decode_tok_s, sc))
        if p.mean_ttft_s:
            out.append(Target(f"{label} ttft", "mean_ttft_s", p.mean_ttft_s, sc, weight=0.5))
        if sc.steps > 0 and p.accept_length:
            out.append(Target(f"{label} accept length", "accept_length", p.accept_length, sc, weight=0.5))
    return out


def refit(profile: Profile, measured: list[FitPoint], max_evals: int) -> tuple[Profile, float]:
    """The profile refitted to every measured point so far (from the current one: each refit starts where the last
    ended), and the fit's objective."""
    result = fit(targets(measured), profile, free=TUNE_FREE, max_evals=max_evals)
    return result.profile, result.objective
