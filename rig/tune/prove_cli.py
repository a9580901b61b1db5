"""`rig prove`: the static settings, the schedule read off them and the engine's adaptive controller, measured on
the same requests at the same loads, and judged band by band (rig.tune.prove, rig.analysis.prove)."""

from __future__ import annotations

import sys
from typing import Any

import click

from rig.cli_options import csv_ints, csv_workloads, resolve_spec, run_options
from rig.cli_settings import settings_from, settings_options
from rig.contracts import ProveSettings

PROVE_PARAMS = ("adaptive", "adaptive_steps", "adaptive_config", "tolerance", "from_run")


def _earlier_steps(settings: ProveSettings) -> list[int] | None:
    """The static steps of the earlier proof --from names (None: no --from); one line if it is not one."""
    if settings.from_run is None:
        return None
    from rig.results import load_manifest

    try:
        prior = load_manifest(settings.from_run)
    except Exception as e:
        raise click.BadParameter(f"{settings.from_run}: {str(e).splitlines()[0]}", param_hint="--from") from None
    if prior.prove is None:
        raise click.BadParameter(f"{settings.from_run} is not a rig prove run", param_hint="--from")
    return [a.steps for a in prior.prove.arms if a.kind == "static"]


@click.command("prove")
@click.option("--steps", "steps_csv", help="Static steps values to measure (steps 0 is always added), e.g. 1,2,3,4.")
@settings_options(ProveSettings, *PROVE_PARAMS)
@run_options
def prove(steps_csv: str | None, **kw: Any) -> None:
    """Does a schedule, or the engine's adaptive controller, beat every static setting at every load? Measures each
    static steps value (0 included) at every --concurrency level, reads the best steps per load band off them (as
    rig report's schedule does), runs that schedule as the engine's own per-batch-size configuration (an SGLang
    adaptive config, one candidate per slot; vLLM's num_speculative_tokens_per_batch_size), then the engine's
    adaptive controller (SGLang and the simulator: vLLM has none), all on the same requests, and prints per band
    each arm's throughput against the best static setting with a paired 95 % interval.
    Across load changes: `rig prove --from RUN --load-profile 1:60s,64:60s,1:60s` runs RUN's arms (its static steps,
    its schedule with the same config file, its adaptive arm) on one point each whose load follows the profile, and
    judges them phase by phase (steady state) and over the whole profile.
    Resume an interrupted proof with `rig sweep --resume RUN_DIR`."""
    from rig.cli import execute, print_dry_run
    from rig.tune.prove import prove_planner

    settings = settings_from(ProveSettings, {n: kw.pop(n) for n in PROVE_PARAMS})
    steps = sorted({0, *(csv_ints("--steps", steps_csv) or _earlier_steps(settings) or [0, 1, 2, 3, 4])})
    if settings.from_run is not None and not kw.get("load_profile"):
        raise click.UsageError("--from RUN proves across load changes: give --load-profile (e.g. 1:60s,64:60s,1:60s)")
    if settings.from_run is None and kw.get("load_profile"):
        raise click.UsageError("a load profile needs the arms of an earlier proof: rig prove --from RUN --load-profile")
    if kw.get("rate") or kw.get("mode") not in (None, "closed"):
        raise click.UsageError("rig prove measures closed-loop levels (a schedule is by batch size); drop --rate")
    spec = resolve_spec(kw, steps, csv_workloads(kw["workload"]))  # the schedule is read off the first
    engine = spec.server_configs()[0].engine
    if engine not in ("sim", "sglang", "vllm"):
        raise click.UsageError(
            "rig prove launches the schedule as the engine's own configuration, an SGLang adaptive config or vLLM's "
            f"num_speculative_tokens_per_batch_size: --engine sim, sglang or vllm (got {engine})"
        )
    if engine == "vllm" and (settings.adaptive_steps is not None or settings.adaptive_config is not None):
        raise click.UsageError(
            "vLLM has no adaptive controller (--adaptive-steps and --adaptive-config are SGLang's): drop them"
        )
    if kw["dry_run"]:
        print_dry_run(spec)
        return
    sys.exit(execute(spec, kw["quiet"], planner=prove_planner(spec, settings)))
