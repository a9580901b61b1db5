"""Command-line glue of the SLO search (`rig sweep --search`) and `rig tune`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from rig.analysis.metrics import parse_slo
from rig.tune.slo_search import SEARCH_KEY, SearchSettings, search_planner


def _parsed(texts: tuple[str, ...]) -> list:
    if not texts:
        raise click.UsageError("--search needs at least one --slo (e.g. --slo ttft=500ms --slo tpot=50ms)")
    try:
        return [parse_slo(t) for t in texts]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None


def search_settings(variable: str, slo_texts: tuple[str, ...], percentile: float, maximum: float | None,
                    tolerance: float, kw: dict[str, Any]) -> SearchSettings:
    """Validate the search flags; the first --concurrency (--rate) value is where the search starts."""
    from rig.tune.probe import slo_texts as to_texts

    slos = _parsed(slo_texts)
    if variable == "concurrency":
        if kw.get("rate") or kw.get("mode") not in (None, "closed"):
            raise click.UsageError("--search concurrency runs a closed loop; drop --rate/--mode (or --search rate)")
        start = float(kw["concurrency"].split(",")[0]) if kw.get("concurrency") else 1.0
        maximum = maximum or 1024
        if start < 1 or start != int(start) or maximum < start:
            raise click.BadParameter(f"the search starts at {start:g} and stops at {maximum:g}", param_hint="--concurrency")
    else:
        if kw.get("mode") in ("closed", "trace"):
            raise click.UsageError("--search rate needs an open loop (--mode poisson or gamma)")
        if not kw.get("rate"):
            kw["rate"] = "1"
        try:
            start = float(kw["rate"].split(",")[0])
        except ValueError:
            raise click.BadParameter(f"expected a number, got {kw['rate']!r}", param_hint="--rate") from None
        maximum = maximum or 1000.0
        if start <= 0 or maximum < start:
            raise click.BadParameter(f"the search starts at {start:g} and stops at {maximum:g}", param_hint="--rate")
    return SearchSettings(variable, tuple(to_texts(slos)), percentile, start, maximum, tolerance)


def resumed_planner(spec, manifest: dict[str, Any]):
    """The planner a resumed run continues with: the recorded search or tune, or None for a grid sweep."""
    if SEARCH_KEY in manifest and (manifest[SEARCH_KEY] or {}).get("settings"):
        return search_planner(spec, SearchSettings.from_manifest(manifest[SEARCH_KEY]["settings"]))
    if "tune" in manifest and (manifest["tune"] or {}).get("settings"):
        from rig.tune.tune import TuneSettings, tune_planner

        return tune_planner(spec, TuneSettings.from_manifest(manifest["tune"]["settings"]))
    return None


def _tune_command():
    from rig.cli import execute, print_dry_run, resolve_spec, run_options, _csv_ints

    @click.command("tune")
    @click.option("--steps", "steps_csv", help="Steps values to choose from, e.g. 0,1,2,3,4.")
    @click.option("--slo", "slo_texts", multiple=True, metavar="METRIC=VALUE",
                  help="An SLO the answer must meet, e.g. --slo ttft=500ms --slo tpot=50ms.")
    @click.option("--slo-percentile", type=click.FloatRange(0, 100, min_open=True), default=99.0, show_default=True,
                  help="The percentile the SLOs apply to.")
    @click.option("--start-profile", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                  help="Simulator profile the model starts from (default: the shipped reference profile).")
    @click.option("--confidence", type=click.FloatRange(0, 10), default=0.2, show_default=True,
                  help="Trust a prediction without measuring when it misses the SLO by more than this share of it.")
    @click.option("--max-rounds", type=click.IntRange(1, 100), default=8, show_default=True,
                  help="Measure-and-refit rounds at most.")
    @click.option("--fit-evals", type=click.IntRange(10, 5000), default=120, show_default=True,
                  help="Objective evaluations per pass of each refit.")
    @run_options
    def tune(steps_csv: str | None, slo_texts: tuple[str, ...], slo_percentile: float, start_profile: Path | None,
             confidence: float, max_rounds: int, fit_evals: int, **kw: Any) -> None:
        """The best speculative setting for a load and an SLO: measure a few points per configuration, fit the
        simulator's model to them, predict every configuration's SLO boundary, measure only where that decides the
        answer, refit, and stop when the measured answer is stable. --concurrency gives the load levels to choose
        from. Resume an interrupted tune with `rig sweep --resume RUN_DIR`."""
        from rig.tune.probe import slo_texts as to_texts
        from rig.tune.tune import TuneSettings, tune_planner

        slos = _parsed(slo_texts)
        if kw.get("rate") or kw.get("mode") not in (None, "closed"):
            raise click.UsageError("rig tune chooses among closed-loop concurrency levels; drop --rate/--mode")
        workloads = [kw["workload"]] if kw["workload"] else None
        if kw["workload"] and "," in kw["workload"]:
            raise click.BadParameter("rig tune answers for one workload", param_hint="--workload")
        spec = resolve_spec(kw, _csv_ints("--steps", steps_csv), workloads)
        settings = TuneSettings(tuple(to_texts(slos)), slo_percentile, str(start_profile) if start_profile else None,
                                confidence, max_rounds, fit_evals)
        try:
            from rig.tune.predict import Replay

            cfg = spec.server_configs()[0]
            Replay(spec.workloads[0], spec.load.seed, {}).scenario(cfg.steps, 1, 2, None, cfg.tp)
        except ValueError as e:
            raise click.UsageError(str(e).splitlines()[0]) from None
        if kw["dry_run"]:
            print_dry_run(spec)
            return
        sys.exit(execute(spec, kw["quiet"], planner=tune_planner(spec, settings)))

    return tune


tune = _tune_command()
