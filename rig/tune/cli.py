"""Command-line glue of the SLO search (`rig sweep --search`) and `rig tune` (mounted in rig/cli.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from rig.analysis.metrics import parse_slo
from rig.contracts import Manifest
from rig.tune.search import MAX_CONCURRENCY, MAX_RATE
from rig.tune.slo_search import SearchSettings, search_planner

if TYPE_CHECKING:
    from rig.config import RunSpec
    from rig.run.points import Point
    from rig.run.runner import Runner


def parse_slos(texts: tuple[str, ...]) -> list:
    """The --slo flags parsed; none, or a bad one, is a usage error."""
    if not texts:
        raise click.UsageError("--search needs at least one --slo (e.g. --slo ttft=500ms --slo tpot=50ms)")
    try:
        return [parse_slo(t) for t in texts]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None


def search_settings(
    variable: str,
    slo_texts: tuple[str, ...],
    percentile: float,
    maximum: float | None,
    tolerance: float,
    kw: dict[str, Any],
) -> SearchSettings:
    """Validate the search flags; the first --concurrency (--rate) value is where the search starts."""
    from rig.tune.probe import slo_texts as to_texts

    slos = parse_slos(slo_texts)
    if variable == "concurrency":
        if kw.get("rate") or kw.get("mode") not in (None, "closed"):
            raise click.UsageError("--search concurrency runs a closed loop; drop --rate/--mode (or --search rate)")
        start = float(kw["concurrency"].split(",")[0]) if kw.get("concurrency") else 1.0
        maximum = maximum or MAX_CONCURRENCY
        if start < 1 or start != int(start) or maximum < start:
            raise click.BadParameter(
                f"the search starts at {start:g} and stops at {maximum:g}", param_hint="--concurrency"
            )
        if kw.get("requests") and kw["requests"] < maximum:  # a 'max passing 16' from 4 requests measured 4
            click.echo(
                f"rig: note: --requests {kw['requests']} is below the search's maximum {maximum:g}: a probe "
                f"above {kw['requests']} has at most {kw['requests']} requests in flight (give --requests >= "
                f"--search-max, or --duration)",
                err=True,
            )
    else:
        if kw.get("mode") in ("closed", "trace"):
            raise click.UsageError("--search rate needs an open loop (--mode poisson or gamma)")
        if not kw.get("rate"):
            kw["rate"] = "1"
        try:
            start = float(kw["rate"].split(",")[0])
        except ValueError:
            raise click.BadParameter(f"expected a number, got {kw['rate']!r}", param_hint="--rate") from None
        maximum = maximum or MAX_RATE
        if start <= 0 or maximum < start:
            raise click.BadParameter(f"the search starts at {start:g} and stops at {maximum:g}", param_hint="--rate")
    return SearchSettings(variable, tuple(to_texts(slos)), percentile, start, maximum, tolerance)


def resumed_planner(spec: RunSpec, manifest: Manifest) -> Callable[[Runner], Iterator[Point]] | None:
    """The planner a resumed run continues with: the recorded search or tune, or None for a grid sweep."""
    search, tune = manifest.search or {}, manifest.tune or {}
    if search.get("settings"):
        return search_planner(spec, SearchSettings.from_manifest(search["settings"]))
    if tune.get("settings"):
        from rig.tune.tune import TuneSettings, tune_planner

        return tune_planner(spec, TuneSettings.from_manifest(tune["settings"]))
    return None
