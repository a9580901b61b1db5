"""What `rig tune` knows in a round (``Knowledge``: measured and predicted verdicts, and what follows from both) and
its answer (``recommend``); the rounds themselves are rig.tune.planner.TunePlanner.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.analysis.metrics import Slo
from rig.analysis.slo import describe
from rig.contracts import Recommendation, StartupFacts, TuneSection
from rig.run.runner import Runner
from rig.tune.predict import Verdict


@dataclass
class Knowledge:
    """What is measured, what the model predicts, and what follows from both, for one round."""

    ladder: list[int]
    configs: list[str]
    measured: dict[tuple[str, int], Verdict]
    predicted: dict[tuple[str, int], Verdict]

    def known(self, cid: str, level: int) -> bool | None:
        """Measured, or implied by a measurement through monotonicity; None if neither."""
        got = self.measured.get((cid, level))
        if got is not None:
            return got.meets
        if any(v.meets and lv >= level for (c, lv), v in self.measured.items() if c == cid):
            return True
        if any(not v.meets and lv <= level for (c, lv), v in self.measured.items() if c == cid):
            return False
        return None

    def verdict(self, cid: str, level: int) -> bool:
        k = self.known(cid, level)
        if k is not None:
            return k
        p = self.predicted.get((cid, level))
        return p is not None and p.meets

    def capacity(self, cid: str) -> int | None:
        passing = [lv for lv in self.ladder if self.verdict(cid, lv)]
        return max(passing) if passing else None

    def throughput(self, cid: str, level: int) -> float:
        src = self.measured.get((cid, level)) or self.predicted.get((cid, level))
        return (src.aggregate_tok_s if src is not None else None) or 0.0

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
        p = self.predicted.get((cid, level))
        margin = p.margin if p is not None else None
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


def observed_caps(runner: Runner, cid: str) -> dict[str, int]:
    """max_running_requests and max_total_num_tokens the server reported at startup (the rig records them)."""
    entry = runner.manifest.server_configs.get(cid)
    startup = (entry.startup if entry is not None else None) or StartupFacts()
    caps = {
        "max_running_requests": startup.get("max_running_requests"),
        "max_total_num_tokens": startup.get("max_total_num_tokens"),
    }
    return {k: int(v) for k, v in caps.items() if v}


def design_level(ladder: list[int], predicted: dict[int, Verdict]) -> int:
    """Where the prior model puts the configuration's boundary: its highest predicted passing level, else the lowest."""
    passing = [lv for lv in ladder if lv in predicted and predicted[lv].meets]
    return max(passing) if passing else ladder[0]


def recommend(
    runner: Runner, section: TuneSection, slos: list[Slo], percentile: float, stop_reason: str, grid_points: int
) -> Recommendation:
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
    measured = sum(1 for pr in section.probes if pr.meets is not None)
    rec = Recommendation(
        measured_points=measured,
        grid_points=grid_points,
        stable=stop_reason.startswith("stable"),
        stop_reason=stop_reason,
        per_workload=best,
    )
    if not (best and best[0]["best"]):
        rec.answer = f"no configuration meets {text} at any measured level"
        rec.evidence = f"{measured} points measured; {stop_reason}"
        return rec
    b = best[0]
    mf = f"misses them at {b['min_failing']:g}" if b["min_failing"] is not None else "the highest level tried"
    # the steps the chosen configuration runs (tune's own table; the row's as a fallback for a config it lacks)
    rec.best_steps = section.configs.get(b["server_config"], b["steps"])
    rec.server_config = b["server_config"]
    rec.max_passing = b["max_passing"]
    rec.min_failing = b["min_failing"]
    rec.answer = (
        f"{b['best']} ({b['server_config']}): meets {text} up to concurrency {b['max_passing']:g} "
        f"({mf}), {b['best_aggregate_tok_s']:,.0f} tok/s there"
    )
    runner_up = (
        f"runner-up {b['runner_up']} meets them up to {b['runner_up_max_passing']:g}"
        if b["runner_up"]
        else "no other configuration meets them at any measured level"
    )
    margin = f" (capacity {b['capacity_margin'] * 100:+.0f} %)" if b["capacity_margin"] is not None else ""
    rec.evidence = f"{runner_up}{margin}; {measured} points measured instead of the grid's {grid_points}; {stop_reason}"
    return rec
