"""`rig sim`: launch the simulated server with SGLang's flags, or `rig sim fit` a profile to measurements."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rig.sim.fit_progress import FitProgress
from rig.sim.profile import REFERENCE_PROFILE, Profile, ProfileError, load_profile

if TYPE_CHECKING:
    from rig.sim.fit import FitResult


@click.command(
    "sim",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def sim(argv: tuple[str, ...]) -> None:
    """Run the simulated SGLang server (`rig sim --model-path M [SGLang flags]`), or `rig sim fit ...`."""
    args = list(argv)
    if args and args[0] == "fit":
        fit_cmd.main(args=args[1:], prog_name="rig sim fit", standalone_mode=True)
        return
    from rig.sim.launch import main

    main(args)


@click.command("fit")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--campaign", is_flag=True, help="Fit to the reference campaign's published figures.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the fitted profile here (default: print the table only).",
)
@click.option(
    "--start",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Profile to start from (default: the built-in defaults; with RUN_DIR, the reference profile).",
)
@click.option("--max-evals", type=int, default=1500, show_default=True, help="Objective evaluations per pass.")
@click.option("--name", default=None, help="Name recorded in the profile.")
@click.option(
    "--hold-out",
    "hold_out",
    is_flag=True,
    help="Also fit once without each measured point and predict it: the held-out error beside the in-sample error.",
)
@click.option(
    "--folds",
    type=click.IntRange(min=2),
    default=None,
    help="With --hold-out: K interleaved folds of points instead of one fit per point (for large sweeps).",
)
def fit_cmd(
    run_dir: Path | None,
    campaign: bool,
    output: Path | None,
    start: Path | None,
    max_evals: int,
    name: str | None,
    hold_out: bool,
    folds: int | None,
) -> None:
    """Fit a profile's parameters to the campaign (--campaign) or to a results directory of real runs."""
    from rich.console import Console

    from rig.sim import fit as fitmod

    if campaign == (run_dir is not None):
        raise click.UsageError("give either --campaign or RUN_DIR")
    if folds is not None and not hold_out:
        raise click.UsageError("--folds needs --hold-out")
    from rig.results import run_file_clash

    clash = run_file_clash(output) if output is not None else None
    if clash:  # before the fit (minutes), not after it: the run must stay readable
        raise click.UsageError(f"-o {output}: {clash}; rig never writes over a run's own files (choose another path)")
    free: tuple[str, ...]
    try:
        if run_dir is None:  # --campaign (checked above: exactly one of the two)
            targets = fitmod.campaign_targets()
            base = load_profile(start) if start else Profile.defaults()
            free = fitmod.CAMPAIGN_FREE
            first_step = None  # the campaign's fit starts from its own shipped values
            note = "shared/reference/campaign.md (rig/sim/data/campaign.yaml)"
        else:
            targets = fitmod.run_dir_targets(run_dir)
            base = load_profile(start) if start else load_profile(REFERENCE_PROFILE)
            free = fitmod.RUN_DIR_FREE
            first_step = fitmod.RUN_DIR_FIRST_STEP
            note = f"rig results directory {run_dir}"
    except (ProfileError, ValueError, FileNotFoundError, KeyError) as e:
        raise click.ClickException(str(e)) from None
    console = Console(stderr=True)
    t0 = time.monotonic()
    with console.status("fitting (virtual-time simulation of every scenario per evaluation)...") as status:
        progress = FitProgress(console, max_evals, status)
        result = fitmod.fit(targets, base, free=free, max_evals=max_evals, progress=progress, first_step=first_step)
    elapsed = time.monotonic() - t0
    _print_table(result, elapsed)
    if hold_out:
        try:
            _print_held_out(targets, base, free, max_evals, console, folds, first_step)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
    if output:
        command = [
            "rig",
            "sim",
            "fit",
            *(["--campaign"] if campaign else [str(run_dir)]),
            *(["--start", str(start)] if start else []),
            "--max-evals",
            str(max_evals),
            "-o",
            str(output),
        ]
        prof = fitmod.fitted_profile(result, name or output.stem, command, note)
        prof.save(output)
        click.echo(f"wrote {output}", err=True)


def _print_table(result: FitResult, elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fit: objective {result.objective:.5f}, {result.evaluations} evaluations, {elapsed:.0f} s")
    for col in ("target", "measured", "simulated", "error"):
        t.add_column(col, justify="left" if col == "target" else "right")
    for r in result.rows:
        err = 100 * r["rel_err"]
        style = "green" if abs(err) <= 10 else "red"
        t.add_row(r["label"], f"{r['target']:.2f}", f"{r['sim']:.2f}", f"[{style}]{err:+.1f} %[/{style}]")
    Console().print(t)
    p = Table(title="fitted parameters")
    p.add_column("parameter")
    p.add_column("value", justify="right")
    for n in result.free:
        p.add_row(n, f"{result.profile.values[n]:.6g}")
    Console().print(p)


def _print_held_out(
    targets: list,
    base: Profile,
    free: tuple[str, ...],
    max_evals: int,
    console: object,
    folds: int | None,
    first_step: float | None,
) -> None:
    from rich.console import Console
    from rich.table import Table

    from rig.sim.holdout import hold_out_each_point

    assert isinstance(console, Console)
    with console.status("held-out fits...") as status:
        shown = FitProgress(console, max_evals, status)
        rows = hold_out_each_point(
            targets,
            base,
            free,
            max_evals,
            progress=lambda p, i, n: shown.step(f"held-out fit {i}/{n}: without {p}"),
            folds=folds,
            first_step=first_step,
        )
    how = "a fit to the others" if folds is None else f"a fit without its fold ({folds} folds)"
    t = Table(title=f"held out: each point predicted by {how}")
    for col in ("target", "measured", "predicted", "error"):
        t.add_column(col, justify="left" if col == "target" else "right")
    for r in rows:
        err = 100 * r.rel_err
        style = "green" if abs(err) <= 10 else "red"
        t.add_row(r.label, f"{r.measured:.2f}", f"{r.predicted:.2f}", f"[{style}]{err:+.1f} %[/{style}]")
    Console().print(t)
    for metric in ("aggregate_tok_s", "decode_tok_s"):
        errs = [abs(r.rel_err) for r in rows if r.metric == metric]
        if errs:
            click.echo(
                f"held-out {metric}: max |error| {100 * max(errs):.1f} %, mean {100 * sum(errs) / len(errs):.1f} %"
            )


if __name__ == "__main__":  # pragma: no cover
    sim(sys.argv[1:])
