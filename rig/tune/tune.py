"""`rig tune`: the best speculative setting for a load and an SLO, measuring only where the model cannot decide.

Rounds, each a batch of ordinary points of one run directory:

0. Design: one point per configuration, at the ladder level where the starting profile puts its SLO boundary.
1. Fit the simulator's profile to every point measured so far (``predict.refit``), predict every configuration's
   verdict and throughput at every ladder level (``predict.predict``, with the server limits each server reported).
2. Combine: a measured verdict is known; by monotonicity a pass at level x makes every lower level pass and a miss
   every higher level miss; the rest is predicted. The leader is the configuration meeting the SLOs at the highest
   level L* (ties: higher aggregate tok/s there).
3. Measure what decides the answer and is not known yet: the leader at L* and at the level above, and every other
   configuration at L* unless the model predicts it misses there by more than ``confidence`` (a share of the SLO
   limit); a contender that meets L* too is also measured one level up. Refit, and repeat from 2.
4. Stop when nothing that decides the answer is unknown (the answer is stable), or after ``max_rounds``.

The recommendation is then read off the measured points alone, by the same rule ``rig report`` uses
(``analysis.frontier.best_per_slo``), and every probe is reported with what the model predicted for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from rig.analysis.metrics import Slo, parse_slo
from rig.analysis.slo import DEFAULT_PERCENTILE, describe
from rig.config import RunSpec
from rig.run.points import Point
from rig.run.runner import Runner
from rig.sim.profile import load_profile
from rig.tune.predict import Replay, predict, refit
from rig.tune.probe import output_lengths, read_probe
from rig.tune.slo_search import make_point


@dataclass(frozen=True)
class TuneSettings:
    """What tune looks for and how cautious it is; stored in the manifest so a resumed tune repeats itself."""

    slos: tuple[str, ...]
    percentile: float = DEFAULT_PERCENTILE
    start_profile: str | None = None  # the model's starting point (default: the shipped reference profile)
    confidence: float = 0.2  # a prediction this far past the SLO (share of its limit) is trusted without measuring
    max_rounds: int = 8
    fit_evals: int = 120  # objective evaluations per Nelder-Mead pass of each refit

    @classmethod
    def from_manifest(cls, d: dict[str, Any]) -> TuneSettings:
        return cls(**{**d, "slos": tuple(d["slos"])})


@dataclass
class Knowledge:
    """What is measured, what the model predicts, and what follows from both, for one round."""

    ladder: list[int]
    configs: list[str]
    measured: dict[tuple[str, int], dict[str, Any]]
    predicted: dict[tuple[str, int], dict[str, Any]]

    def known(self, cid: str, level: int) -> bool | None:
        """Measured, or implied by a measurement through monotonicity; None if neither."""
        got = self.measured.get((cid, level))
        if got is not None:
            return got["meets"]
        if any(v["meets"] and lv >= level for (c, lv), v in self.measured.items() if c == cid):
            return True
        if any(not v["meets"] and lv <= level for (c, lv), v in self.measured.items() if c == cid):
            return False
        return None

    def verdict(self, cid: str, level: int) -> bool:
        k = self.known(cid, level)
        return k if k is not None else bool(self.predicted.get((cid, level), {}).get("meets"))

    def capacity(self, cid: str) -> int | None:
        passing = [lv for lv in self.ladder if self.verdict(cid, lv)]
        return max(passing) if passing else None

    def throughput(self, cid: str, level: int) -> float:
        src = self.measured.get((cid, level)) or self.predicted.get((cid, level)) or {}
        return src.get("aggregate_tok_s") or 0.0

    def leader(self) -> tuple[str | None, int | None]:
        ranked = sorted(
            self.configs, key=lambda c: (self.capacity(c) or 0, self.throughput(c, self.capacity(c) or 0)), reverse=True
        )
        best = ranked[0] if ranked and self.capacity(ranked[0]) is not None else None
        return best, (self.capacity(best) if best else None)

    def above(self, level: int) -> int | None:
        i = self.ladder.index(level)
        return self.ladder[i + 1] if i + 1 < len(self.ladder) else None

    def unsure(self, cid: str, level: int, confidence: float) -> bool:
        """Not known, and the model's margin is not clearly past the SLO either way."""
        if self.known(cid, level) is not None:
            return False
        margin = self.predicted.get((cid, level), {}).get("margin")
        return margin is None or margin > -confidence

    def needed(self, confidence: float) -> list[tuple[str, int, str]]:
        """(config, level, why) of every point that decides the answer and is not known yet."""
        best, top = self.leader()
        out: list[tuple[str, int, str]] = []
        if best is None or top is None:  # nothing meets the SLOs anywhere, as far as is known: the lowest level
            low = self.ladder[0]
            return [
                (c, low, "does anything meet the SLOs at the lowest level?")
                for c in self.configs
                if self.known(c, low) is None
            ]
        up = self.above(top)
        if self.known(best, top) is None:
            out.append((best, top, f"leader: does it meet the SLOs at {top}?"))
        if up is not None and self.known(best, up) is None:
            out.append((best, up, f"leader: does it miss them at {up}?"))
        for c in self.configs:
            if c == best:
                continue
            if self.unsure(c, top, confidence):  # a predicted pass is always unsure: ties are measured
                out.append((c, top, f"contender at the leader's level {top}"))
            if up is not None and self.verdict(c, top) and self.unsure(c, up, confidence):
                out.append((c, up, f"tied at {top}: does it miss at {up}?"))
        seen: set[tuple[str, int]] = set()
        unique: list[tuple[str, int, str]] = []
        for cid, level, why in out:  # the first reason for each (config, level) stays
            if (cid, level) not in seen:
                seen.add((cid, level))
                unique.append((cid, level, why))
        return unique


def _observed_caps(runner: Runner, cid: str) -> dict[str, int]:
    """max_running_requests and max_total_num_tokens the server reported at startup (the rig records them)."""
    entry = runner.manifest.server_configs.get(cid)
    startup = (entry.startup if entry is not None else None) or {}
    return {k: int(startup[k]) for k in ("max_running_requests", "max_total_num_tokens") if startup.get(k)}


def _design_level(ladder: list[int], predicted: dict[int, dict[str, Any]]) -> int:
    """Where the prior model puts the configuration's boundary: its highest predicted passing level, else the lowest."""
    passing = [lv for lv in ladder if predicted.get(lv, {}).get("meets")]
    return max(passing) if passing else ladder[0]


def tune_planner(spec: RunSpec, settings: TuneSettings) -> Callable[[Runner], Iterator[Point]]:
    """A planner for Runner: design, fit, predict, measure the deciding points, refit, until the answer is stable."""
    slos = [parse_slo(s) for s in settings.slos]
    configs = spec.server_configs()
    by_id = {c.config_id(): c for c in configs}
    wl = spec.workloads[0]
    ladder = sorted(set(spec.load.concurrency))
    seed = spec.load.seed

    def plan(runner: Runner) -> Iterator[Point]:
        section = runner.manifest.tune = runner.manifest.tune or {}
        section.update(
            settings=asdict(settings) | {"slos": list(settings.slos)},
            describe=describe(slos, settings.percentile),
            ladder=ladder,
            workload=wl.name,
            configs={cid: c.steps for cid, c in by_id.items()},
            probes=[],
            rounds=[],
            recommendation=None,
        )
        profile = load_profile(settings.start_profile)
        replay = Replay(wl, seed, {})
        caps: dict[str, dict[str, int]] = {}
        measured: dict[tuple[str, int], dict[str, Any]] = {}
        fit_points: list[dict[str, Any]] = []

        def n_requests(level: int) -> int:
            return spec.load.requests_for(level, None) or 2 * level

        def predict_all() -> dict[tuple[str, int], dict[str, Any]]:
            out = {}
            for cid, cfg in by_id.items():
                for lv in ladder:
                    sc = replay.scenario(cfg.steps, lv, n_requests(lv), caps.get(cid), cfg.tp)
                    out[(cid, lv)] = predict(profile, sc, slos, settings.percentile)
            return out

        predicted = predict_all()
        batch = [(cid, _design_level(ladder, {lv: predicted[(cid, lv)] for lv in ladder}), "design") for cid in by_id]
        stop_reason = f"max rounds ({settings.max_rounds}) reached"
        for rnd in range(settings.max_rounds):
            order = list(by_id)
            batch.sort(key=lambda x: (order.index(x[0]), x[1]))  # one server launch per configuration and round
            for cid, lv, why in batch:
                cfg = by_id[cid]
                p = make_point(spec, cfg, wl, "concurrency", lv)
                pred = predicted.get((cid, lv), {})
                entry: dict[str, Any] = {
                    "round": rnd,
                    "point": p.point,
                    "server_config": cid,
                    "steps": cfg.steps,
                    "level": lv,
                    "why": why,
                    "predicted_meets": pred.get("meets"),
                    "predicted_margin": pred.get("margin"),
                    "predicted_aggregate_tok_s": pred.get("aggregate_tok_s"),
                    "predicted_decode_tok_s": pred.get("decode_tok_s"),
                }
                section["probes"].append(entry)
                yield p
                probe = read_probe(runner.run_dir, p.point, slos, settings.percentile)
                if probe is None:
                    entry["error"] = runner.entry(p.point).error or "no rows"
                    runner.save()
                    continue
                entry.update(
                    meets=probe.meets,
                    margin=probe.margin,
                    aggregate_tok_s=probe.aggregate_tok_s,
                    decode_tok_s=probe.decode_tok_s,
                    accept_length=probe.accept_length,
                    flags=probe.flags,
                )
                measured[(cid, lv)] = probe.to_dict()
                caps[cid] = _observed_caps(runner, cid)
                replay.lengths.update(output_lengths(runner.run_dir, p.point))
                fit_points.append({**probe, "cid": cid, "level": lv})
                runner.save()
            if not fit_points:
                stop_reason = "nothing could be measured"
                break
            for fp in fit_points:  # scenarios with the lengths and limits known now
                cfg = by_id[fp["cid"]]
                fp["scenario"] = replay.scenario(
                    cfg.steps, fp["level"], n_requests(fp["level"]), caps.get(fp["cid"]), cfg.tp
                )
            profile, objective = refit(profile, fit_points, settings.fit_evals)
            predicted = predict_all()
            know = Knowledge(ladder, list(by_id), measured, predicted)
            best, top = know.leader()
            batch = know.needed(settings.confidence)
            section["rounds"].append(
                {
                    "round": rnd,
                    "fit_objective": objective,
                    "profile": {
                        k: profile.values[k]
                        for k in ("t_fixed_ms", "t_experts_ms", "c_tok_ms", "d_fixed_ms", "acc_logit_greedy")
                    },
                    "leader": {"server_config": best, "steps": by_id[best].steps if best else None, "level": top},
                    "capacity": {cid: know.capacity(cid) for cid in by_id},
                    "next": [{"server_config": c, "level": lv, "why": w} for c, lv, w in batch],
                }
            )
            runner.save()
            if not batch:
                stop_reason = "stable: every point that decides the answer is measured or predicted beyond the margin"
                break
        section["recommendation"] = recommend(
            runner, section, slos, settings.percentile, stop_reason, len(by_id) * len(ladder)
        )
        runner.save()

    return plan


def recommend(
    runner: Runner, section: dict[str, Any], slos: list[Slo], percentile: float, stop_reason: str, grid_points: int
) -> dict[str, Any]:
    """The answer from the measured points alone (report's rule), with its evidence."""
    from rig.analysis.frontier import best_per_slo
    from rig.analysis.points import campaign_row, load_requests
    from rig.analysis.runs import load_run
    from rig.analysis.slo import evaluate_slos

    run = load_run(runner.run_dir)
    rows, meets = [], {}
    for p in run.points:
        r = load_requests(run, p)
        if r.n == 0:
            continue
        rows.append(campaign_row(run, p, r))
        meets[p.point] = evaluate_slos(r, slos, percentile).meets
    text = describe(slos, percentile)
    best = best_per_slo(run, rows, meets, text) if rows else []
    measured = sum(1 for pr in section["probes"] if pr.get("meets") is not None)
    rec: dict[str, Any] = {
        "measured_points": measured,
        "grid_points": grid_points,
        "stable": stop_reason.startswith("stable"),
        "stop_reason": stop_reason,
        "per_workload": best,
    }
    if best and best[0]["best"]:
        b = best[0]
        mf = f"misses them at {b['min_failing']:g}" if b["min_failing"] is not None else "the highest level tried"
        rec["best_steps"] = b["steps"]
        rec["server_config"] = b["server_config"]
        rec["max_passing"] = b["max_passing"]
        rec["min_failing"] = b["min_failing"]
        rec["answer"] = (
            f"{b['best']} ({b['server_config']}): meets {text} up to concurrency {b['max_passing']:g} "
            f"({mf}), {b['best_aggregate_tok_s']:,.0f} tok/s there"
        )
        runner_up = (
            f"runner-up {b['runner_up']} meets them up to {b['runner_up_max_passing']:g}"
            if b["runner_up"]
            else "no other configuration meets them at any measured level"
        )
        margin = f" (capacity {b['capacity_margin'] * 100:+.0f} %)" if b["capacity_margin"] is not None else ""
        rec["evidence"] = (
            f"{runner_up}{margin}; {measured} points measured instead of the grid's {grid_points}; {stop_reason}"
        )
    else:
        rec["best_steps"] = None
        rec["answer"] = f"no configuration meets {text} at any measured level"
        rec["evidence"] = f"{measured} points measured; {stop_reason}"
    return rec
