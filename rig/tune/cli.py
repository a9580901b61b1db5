"""Command-line glue of the SLO search (`rig sweep --search`) and `rig tune` (mounted in rig/cli.py).

Their settings and flags are declared once, on the fields of rig.contracts.SearchSettings and TuneSettings; the
options come from there (rig.cli_options.settings_options). A flag the chosen command would not use is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from rig.analysis.metrics import Slo, parse_slo
from rig.cli_settings import given_flags, settings_from
from rig.contracts import Manifest, SearchSettings, TuneSettings

if TYPE_CHECKING:
    from rig.config import RunSpec
    from rig.run.points import Point
    from rig.run.runner import Runner

SEARCH_PARAMS = ("variable", "slos", "percentile", "maximum", "tolerance")  # SearchSettings' flags, by field
TUNE_PARAMS = ("slos", "percentile", "start_profile", "confidence", "max_rounds", "fit_evals")


def parse_slos(texts: tuple[str, ...], command: str = "--search") -> list[Slo]:
    """The --slo flags parsed; none, or a bad one, is a usage error."""
    if not texts:
        raise click.UsageError(f"{command} needs at least one --slo (e.g. --slo ttft=500ms --slo tpot=50ms)")
    try:
        return [parse_slo(t) for t in texts]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None


def _slo_texts(slos: list[Slo]) -> tuple[str, ...]:
    from rig.tune.probe import slo_texts

    return tuple(slo_texts(slos))


def _no_repeat(kw: dict[str, Any], what: str) -> None:
    if kw.get("repeat") is not None:
        raise click.UsageError(f"--repeat: {what} measures each point once; drop --repeat")


def search_settings(ctx: click.Context, given: dict[str, Any], kw: dict[str, Any]) -> SearchSettings | None:
    """The search the flags ask for (None: no --search, and then no search flag either); the first --concurrency
    (--rate) value is where it starts."""
    if given["variable"] is None:
        stray = given_flags(ctx, *SEARCH_PARAMS)
        if stray:
            raise click.UsageError(
                f"{', '.join(stray)}: only a search uses {'it' if len(stray) == 1 else 'them'}; "
                f"give --search concurrency (or rate), or drop {'it' if len(stray) == 1 else 'them'}"
            )
        return None
    slos = parse_slos(given["slos"])
    _no_repeat(kw, "a search")
    start = _concurrency_start(ctx, kw) if given["variable"] == "concurrency" else _rate_start(kw)
    settings = settings_from(SearchSettings, given, slos=_slo_texts(slos), start=start)
    top = settings.top()
    if top < start:
        hint = "--concurrency" if settings.variable == "concurrency" else "--rate"
        raise click.BadParameter(f"the search starts at {start:g} and stops at {top:g}", param_hint=hint)
    if settings.variable == "concurrency" and kw.get("requests") and kw["requests"] < top:
        click.echo(  # a 'max passing 16' from 4 requests measured 4
            f"rig: note: --requests {kw['requests']} is below the search's maximum {top:g}: a probe "
            f"above {kw['requests']} has at most {kw['requests']} requests in flight (give --requests >= "
            f"--search-max, or --duration)",
            err=True,
        )
    return settings.model_copy(update={"maximum": top})


def _concurrency_start(ctx: click.Context, kw: dict[str, Any]) -> float:
    if kw.get("rate") or kw.get("mode") not in (None, "closed"):
        raise click.UsageError("--search concurrency runs a closed loop; drop --rate/--mode (or --search rate)")
    if given_flags(ctx, "tolerance"):
        raise click.UsageError("--search-tolerance applies to --search rate, not --search concurrency; drop it")
    levels = (kw.get("concurrency") or "1").split(",")
    if len(levels) > 1:
        raise click.UsageError(
            f"--concurrency {kw['concurrency']}: --search concurrency starts from one value and finds the rest; "
            f"give one"
        )
    try:
        start = float(levels[0])
    except ValueError:
        raise click.BadParameter(
            f"expected an integer, got {kw['concurrency']!r}", param_hint="--concurrency"
        ) from None
    if start < 1 or start != int(start):
        raise click.BadParameter(f"the search starts at {start:g}: give an integer >= 1", param_hint="--concurrency")
    return start


def _rate_start(kw: dict[str, Any]) -> float:
    if kw.get("mode") in ("closed", "trace"):
        raise click.UsageError("--search rate needs an open loop (--mode poisson or gamma)")
    if not kw.get("rate"):
        kw["rate"] = "1"
    rates = kw["rate"].split(",")
    if len(rates) > 1:
        raise click.UsageError(f"--rate {kw['rate']}: --search rate starts from one rate and finds the rest; give one")
    try:
        start = float(rates[0])
    except ValueError:
        raise click.BadParameter(f"expected a number, got {kw['rate']!r}", param_hint="--rate") from None
    if start <= 0:
        raise click.BadParameter(f"the search starts at {start:g}: give a rate > 0", param_hint="--rate")
    return start


def tune_settings(given: dict[str, Any], kw: dict[str, Any]) -> TuneSettings:
    """What the tune flags ask for; tune chooses among closed-loop concurrency levels, measured once each."""
    slos = parse_slos(given["slos"], "rig tune")
    if kw.get("rate") or kw.get("mode") not in (None, "closed"):
        raise click.UsageError("rig tune chooses among closed-loop concurrency levels; drop --rate/--mode")
    _no_repeat(kw, "rig tune")
    return settings_from(TuneSettings, given, slos=_slo_texts(slos))


def resumed_planner(spec: RunSpec, manifest: Manifest) -> Callable[[Runner], Iterator[Point]] | None:
    """The planner a resumed run continues with: the recorded search or tune, or None for a grid sweep."""
    if manifest.search is not None and manifest.search.settings is not None:
        from rig.tune.slo_search import search_planner

        return search_planner(spec, manifest.search.settings)
    if manifest.tune is not None and manifest.tune.settings is not None:
        from rig.tune.planner import tune_planner

        return tune_planner(spec, manifest.tune.settings)
    if manifest.prove is not None and manifest.prove.settings is not None:
        from rig.tune.prove import prove_planner

        return prove_planner(spec, manifest.prove.settings)
    return None
