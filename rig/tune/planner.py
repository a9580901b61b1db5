"""`rig tune`'s rounds: the best speculative setting for a load and an SLO, measuring only where the model cannot
decide.

Rounds, each a batch of ordinary points of one run directory:

0. Design: one point per configuration, at the ladder level where the starting profile puts its SLO boundary.
1. Fit the simulator's profile to every point measured so far (``predict.refit``), predict every configuration's
   verdict and throughput at every ladder level (``predict.predict``, with the server limits each server reported).
2. Combine: a measured verdict is known; by monotonicity a pass at level x makes every lower level pass and a miss
   every higher level miss; the rest is predicted. The leader is the configuration meeting the SLOs at the highest
   level L* (ties: higher aggregate tok/s there).
3. Measure what decides the answer and is not known yet: the leader at L* and at the level above, and every other
   configuration at L* unless the model predicts it misses there by more than ``confidence`` (a share of the SLO
   limit); a contender that meets L* too is also measured one level up. After each point the rest of the round is
   decided again from what it showed (a point it implies is dropped; if the leader or L* moved, what they need is
   added, for configurations not launched yet this round). Refit, and repeat from 2.
4. Stop when nothing that decides the answer is unknown (the answer is stable), or after ``max_rounds``.

The recommendation is then read off the measured points alone, by the same rule ``rig report`` uses
(``analysis.frontier.best_per_slo``), and every probe is reported with what the model predicted for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rig.analysis.metrics import parse_slo
from rig.analysis.slo import describe
from rig.config import RunSpec
from rig.contracts import Probe, TuneLeader, TuneNext, TuneProbe, TuneRound, TuneSection, TuneSettings
from rig.run.points import Point
from rig.run.runner import Runner
from rig.sim.profile import Profile, load_profile
from rig.tune.predict import FitPoint, Prediction, Replay, Verdict, predict, refit
from rig.tune.probe import output_lengths, read_probe
from rig.tune.slo_search import make_point
from rig.tune.tune import Knowledge, design_level, observed_caps, recommend

Batch = list[tuple[str, int, str]]  # (server config id, level, why) of the points to measure next
FITTED = ("t_fixed_ms", "t_experts_ms", "c_tok_ms", "d_fixed_ms", "acc_logit_greedy")  # recorded per round


@dataclass(frozen=True)
class Observation:
    """What one measured point tells tune: its probe, request_id -> output tokens, the server's startup limits."""

    probe: Probe
    lengths: dict[str, int]
    caps: dict[str, int]


class TunePlanner:
    """A planner for Runner: design, fit, predict, measure the deciding points, refit, until the answer is stable.

    Called with the runner, it yields the points to run one at a time and reads each back once it has run; what it
    decides is recorded in the manifest's ``tune`` section as it goes (a resumed tune repeats the same decisions).
    """

    def __init__(self, spec: RunSpec, settings: TuneSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.slos = [parse_slo(s) for s in settings.slos]
        self.by_id = {c.config_id(): c for c in spec.server_configs()}
        self.wl = spec.workloads[0]
        self.ladder = sorted(set(spec.load.concurrency))
        self.section = TuneSection()
        self.profile: Profile | None = None
        self.replay = Replay(self.wl, spec.load.seed, {})
        self.caps: dict[str, dict[str, int]] = {}
        self.measured: dict[tuple[str, int], Verdict] = {}
        self.predicted: dict[tuple[str, int], Prediction] = {}
        self.fit_points: list[FitPoint] = []

    def __call__(self, runner: Runner) -> Iterator[Point]:
        self._start(runner)
        batch = self._design()
        stop_reason = f"max rounds ({self.settings.max_rounds}) reached"
        for rnd in range(self.settings.max_rounds):
            queue, tried = self._in_launch_order(batch), set()
            while queue:
                cid, lv, why = queue.pop(0)
                tried.add((cid, lv))
                yield from self._measure(runner, rnd, cid, lv, why)
                if rnd > 0:  # the design round measures every configuration once, whatever the first one showed
                    queue = self._still_needed(cid, tried)
            if not self.fit_points:
                stop_reason = "nothing could be measured"
                break
            batch = self._refit_and_decide(rnd)
            runner.save()
            if not batch:
                stop_reason = "stable: every point that decides the answer is measured or predicted beyond the margin"
                break
        self.conclude(runner, stop_reason)
        runner.save()

    # ---- where measurements come from and where the answer is read (a virtual-time tune replaces both) ----
    def observe(self, runner: Runner, p: Point) -> Observation | None:
        """What the server showed at one point that ran: its probe, each request's output length, the server's
        startup limits; None when it has no rows (it did not run: e.g. its server did not start)."""
        probe = read_probe(runner.run_dir, p.point, self.slos, self.settings.percentile)
        if probe is None:
            return None
        return Observation(probe, output_lengths(runner.run_dir, p.point), observed_caps(runner, p.config_id))

    def conclude(self, runner: Runner, stop_reason: str) -> None:
        """The recommendation, read off the run's measured points by rig report's rule."""
        self.section.recommendation = recommend(
            runner, self.section, self.slos, self.settings.percentile, stop_reason, len(self.by_id) * len(self.ladder)
        )

    def _start(self, runner: Runner) -> None:
        """A fresh start: the manifest's tune section, the starting profile, nothing measured."""
        self.section = runner.manifest.tune = runner.manifest.tune or TuneSection()
        self.section.settings = self.settings
        self.section.describe = describe(self.slos, self.settings.percentile)
        self.section.ladder = self.ladder
        self.section.workload = self.wl.name
        self.section.configs = {cid: c.steps for cid, c in self.by_id.items()}
        self.section.probes, self.section.rounds, self.section.recommendation = [], [], None
        self.profile = load_profile(self.settings.start_profile)
        self.replay = Replay(self.wl, self.spec.load.seed, {})
        self.caps, self.measured, self.fit_points = {}, {}, []

    def _design(self) -> Batch:
        """Round 0: each configuration at the level where the starting profile puts its boundary."""
        self.predicted = self._predict_all()
        return [
            (cid, design_level(self.ladder, {lv: self.predicted[(cid, lv)] for lv in self.ladder}), "design")
            for cid in self.by_id
        ]

    def _in_launch_order(self, batch: Batch) -> Batch:
        """One server launch per configuration and round."""
        order = list(self.by_id)
        return sorted(batch, key=lambda x: (order.index(x[0]), x[1]))

    def _still_needed(self, current: str, tried: set[tuple[str, int]]) -> Batch:
        """The rest of the round, decided again after each point with what it showed (the round's predictions
        unchanged): a point a measurement now implies is dropped, one the new leader needs is added. Only
        configurations from ``current`` on in launch order (one launch per configuration and round); the others
        wait for the next round."""
        know = Knowledge(self.ladder, list(self.by_id), self.measured, dict(self.predicted))
        order = list(self.by_id)
        return self._in_launch_order(
            [
                (cid, lv, why)
                for cid, lv, why in know.needed(self.settings.confidence)
                if order.index(cid) >= order.index(current) and (cid, lv) not in tried
            ]
        )

    def _n_requests(self, level: int) -> int:
        return self.spec.load.requests_for(level, None) or 2 * level

    def _predict_all(self) -> dict[tuple[str, int], Prediction]:
        assert self.profile is not None
        out = {}
        for cid, cfg in self.by_id.items():
            for lv in self.ladder:
                sc = self.replay.scenario(cfg.steps, lv, self._n_requests(lv), self.caps.get(cid), cfg.tp)
                out[(cid, lv)] = predict(self.profile, sc, self.slos, self.settings.percentile)
        return out

    def _measure(self, runner: Runner, rnd: int, cid: str, lv: int, why: str) -> Iterator[Point]:
        """Run one point, then record what it measured beside what the model predicted for it."""
        cfg = self.by_id[cid]
        p = make_point(self.spec, cfg, self.wl, "concurrency", lv)
        pred = self.predicted.get((cid, lv))
        entry = TuneProbe(round=rnd, point=p.point, server_config=cid, steps=cfg.steps, level=lv, why=why)
        if pred is not None:
            entry.predicted_meets, entry.predicted_margin = pred.meets, pred.margin
            entry.predicted_aggregate_tok_s, entry.predicted_decode_tok_s = pred.aggregate_tok_s, pred.decode_tok_s
        self.section.probes.append(entry)
        yield p
        seen = self.observe(runner, p)
        if seen is None:
            entry.error = runner.entry(p.point).error or "no rows"
            runner.save()
            return
        probe = seen.probe
        entry.meets, entry.margin = probe.meets, probe.margin
        entry.aggregate_tok_s, entry.decode_tok_s = probe.aggregate_tok_s, probe.decode_tok_s
        entry.accept_length, entry.flags = probe.accept_length, probe.flags
        self.measured[(cid, lv)] = Verdict(probe.meets, probe.margin, probe.aggregate_tok_s)
        self.caps[cid] = seen.caps
        self.replay.lengths.update(seen.lengths)
        self.fit_points.append(
            FitPoint(
                point=p.point,
                server_config=cid,
                level=lv,
                aggregate_tok_s=probe.aggregate_tok_s,
                decode_tok_s=probe.decode_tok_s,
                mean_ttft_s=probe.mean_ttft_s,
                accept_length=probe.accept_length,
            )
        )
        runner.save()

    def _refit_and_decide(self, rnd: int) -> Batch:
        """Refit the profile to every measured point, predict again, and choose what to measure next."""
        assert self.profile is not None
        for fp in self.fit_points:  # scenarios with the lengths and limits known now
            cfg = self.by_id[fp.server_config]
            caps = self.caps.get(fp.server_config)
            fp.scenario = self.replay.scenario(cfg.steps, fp.level, self._n_requests(fp.level), caps, cfg.tp)
        self.profile, objective = refit(self.profile, self.fit_points, self.settings.fit_evals)
        self.predicted = self._predict_all()
        know = Knowledge(self.ladder, list(self.by_id), self.measured, dict(self.predicted))
        best, top = know.leader()
        batch = know.needed(self.settings.confidence)
        self.section.rounds.append(
            TuneRound(
                round=rnd,
                fit_objective=objective,
                profile={k: self.profile.values[k] for k in FITTED},
                leader=TuneLeader(server_config=best, steps=self.by_id[best].steps if best else None, level=top),
                capacity={cid: know.capacity(cid) for cid in self.by_id},
                next=[TuneNext(server_config=c, level=lv, why=w) for c, lv, w in batch],
            )
        )
        return batch


def tune_planner(spec: RunSpec, settings: TuneSettings) -> TunePlanner:
    """The planner Runner calls for `rig tune` (and for a resumed tune)."""
    return TunePlanner(spec, settings)
