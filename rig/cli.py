"""The `rig` command line: run, sweep, tune, check (and report, compare, sim from their subsystems)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml
from click.core import ParameterSource

from rig.cli_options import csv_ints, csv_workloads, resolve_spec, run_options, slo_options, spec_field
from rig.cli_settings import settings_options
from rig.config import RunSpec, SpecError, build_spec
from rig.contracts import SearchSettings, TuneSettings
from rig.spec_yaml import load_yaml

if TYPE_CHECKING:  # imported when used: a command loads only what it needs
    from rig.run.points import Point
    from rig.run.runner import Runner

EXIT_USAGE = 2


DRY_RUN_PORT = 30000  # SGLang's default --port


def print_notices(spec: RunSpec) -> None:
    """One 'note:' line on stderr per surprise the spec holds (see rig.notices)."""
    from rig.notices import notices

    for n in notices(spec):
        click.echo(f"rig: note: {n}", err=True)


def print_dry_run(spec: RunSpec) -> None:
    from rig.results import mask_url_credentials
    from rig.run.points import expand_points
    from rig.server.engines import engine_for

    print_notices(spec)

    doc = json.loads(spec.model_dump_json())
    click.echo("# resolved spec")
    click.echo(mask_url_credentials(yaml.safe_dump(doc, sort_keys=False).rstrip()))
    click.echo("\n# server commands (one launch per configuration)")
    for cfg in spec.server_configs():
        eng = engine_for(cfg.engine)
        # The address it binds, as ServerLifecycle.launch chooses it: loopback for the embedded default (one
        # machine), all interfaces of the server node on a cluster.
        host = cfg.host or ("127.0.0.1" if spec.cluster.address is None else "0.0.0.0")
        # A command to paste into a shell on the server node: a concrete port (SGLang's default when rig would
        # pick a free one at run time, said after it), shell-quoted for display only (rig runs argument lists).
        argv = eng.argv(cfg, host, cfg.port or DRY_RUN_PORT) if eng.launches_process else []
        if argv and not cfg.python and cfg.engine != "command":
            argv[0] = "python"  # the server node's interpreter, not this machine's path (--engine-python pins one)
        import shlex

        url = mask_url_credentials(str(cfg.url))
        line = shlex.join(argv) if argv else f"(nothing launched: external server at {url})"
        if argv and not cfg.port:
            line += f"  # rig picks a free port at run time ({DRY_RUN_PORT} shown)"
        click.echo(f"{cfg.config_id()}: {line}")
    click.echo("\n# placement")
    c = spec.cluster
    if c.address is None:
        click.echo(
            f"local Ray on this machine: server actor (engine {spec.server.engine}) and {spec.clients} "
            f"generator(s) on one node"
        )
    else:
        gpus = max(engine_for(x.engine).num_gpus(x) for x in spec.server_configs())
        sel = " ".join(
            [f"{k}={v}" for k, v in c.server_label.items()]
            + ([f"resource:{c.server_resource}"] if c.server_resource else [])
        )
        csel = " ".join(
            [f"{k}={v}" for k, v in c.client_label.items()]
            + ([f"resource:{c.client_resource}"] if c.client_resource else [])
        )
        click.echo(
            f"Ray at {c.address}: server actor on [{sel or 'any'}] with num_gpus={gpus}; "
            f"{spec.clients} generator(s) on [{csel or 'any'}], {c.per_host} per host"
        )
    points = expand_points(spec)
    click.echo(f"\n# {len(points)} point(s)")
    for p in points:
        click.echo(f"{p.point}")


def execute(
    spec: RunSpec,
    quiet: bool,
    resume_dir: Path | None = None,
    planner: Callable[[Runner], Iterable[Point]] | None = None,
    redo: frozenset[str] = frozenset(),
) -> int:
    """Run the spec (or a planner's adaptive points) with a progress bar, print the campaign table, return the exit
    code."""
    from rich.console import Console

    from rig.progress_ui import ProgressUI
    from rig.run.errors import RunError, RunInputError
    from rig.run.runner import Runner
    from rig.run.signals import install_signal_handlers
    from rig.run.statuses import EXIT_CODES

    console = Console(stderr=True)
    progress_ui = ProgressUI(console, quiet)
    run_dir = resume_dir or spec.run_dir
    print_notices(spec)
    try:
        runner = Runner(
            spec,
            progress=progress_ui.callbacks(),
            resume=resume_dir is not None,
            handle_signals=True,
            run_dir=resume_dir,
            planner=planner,
            redo=redo,
        )
        install_signal_handlers(runner.stop)  # again inside the runner once Ray is up (Ray replaces SIGTERM's handler)
        with progress_ui:
            manifest = runner.run()
    except RunInputError as e:
        raise click.UsageError(str(e)) from None
    except RunError as e:
        raise click.ClickException(str(e)) from None
    except Exception as e:  # never a bare traceback: one line here, the traceback in the run's driver.log
        import traceback

        log = run_dir / "logs" / "driver.log"
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(traceback.format_exc())
            where = f" (traceback in {log})"
        except OSError:
            where = ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise click.ClickException(f"{type(e).__name__}: {first}{where}") from None
    if runner.nothing_to_do:
        console.print(f"nothing to resume: every point of {run_dir} is complete and its records are on disk")
        return 0
    _print_table(run_dir)
    if planner is not None:
        from rig.analysis.adaptive import print_adaptive

        print_adaptive(run_dir)
    for cfg_entry in manifest.server_configs.values():
        for w in cfg_entry.warnings or []:  # requested values the server changed (manifest: effective)
            console.print(f"[yellow]! {w}[/yellow]")
    status = str(manifest.status)
    if status == "interrupted":  # the manifest is final: further Ctrl-C (an impatient user) must not kill the exit
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    console.print(
        f"results: {run_dir}  status: {status}" + (f" ({manifest.stop_reason})" if manifest.stop_reason else "")
    )
    return EXIT_CODES.get(status, 1)


def _print_table(run_dir: Path) -> None:
    """The campaign table, then what went wrong per point (errors with counts, each flag's figure)."""
    from rich.console import Console

    from rig.analysis.runs import load_run
    from rig.analysis.settings import grid_knobs
    from rig.analysis.tables import adaptive_configs, campaign_table, render_campaign_table, render_problems

    run = load_run(run_dir)
    rows = campaign_table(run)
    # Not a terminal (a pipe, a CI log): wide enough that no header or number is cut.
    out = Console(width=None if sys.stdout.isatty() else 200)
    out.print(render_campaign_table(rows, grid_knobs(run), adaptive_configs(run)))
    problems = render_problems(rows)
    if problems is not None:
        out.print(problems)
    from rig.results import load_manifest

    if any(p.phases for p in load_manifest(run_dir).points):  # a load profile: its phases, steady and adapting
        from rig.analysis.runs import load_run
        from rig.analysis.timeline_data import run_timelines
        from rig.analysis.timeline_render import phase_table

        for tl in run_timelines(load_run(run_dir)):
            out.print(phase_table(tl))


class LazyGroup(click.Group):
    """Commands that live with their subsystem are imported when named (or listed by --help), so `rig --version`
    and a bad flag answer without importing Ray, pyarrow or the analysis stack. A broken import still fails loudly:
    the import error surfaces when the command is used or listed."""

    lazy: dict[str, str] = {
        "report": "rig.analysis.cli:report",
        "compare": "rig.analysis.cli:compare",
        "query": "rig.analysis.query:query",
        "sim": "rig.sim.cli:sim",
        "prove": "rig.tune.prove_cli:prove",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            import importlib

            module, _, attr = self.lazy[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="rig")
def cli() -> None:
    """rig: a distributed test rig for LLM serving with speculative decoding."""


@cli.command()
@click.option(
    "--steps",
    type=int,
    help="Speculative steps (0 = no speculation). "
    f"Default {spec_field('steps').get_default(call_default_factory=True)[0]}.",
)
@run_options
def run(steps: int | None, **kw: Any) -> None:
    """Run one server configuration over its concurrency levels (or rates) and record every request."""
    workloads = [kw["workload"]] if kw["workload"] else None
    if kw["workload"] and "," in kw["workload"]:
        raise click.BadParameter("rig run takes one workload; use rig sweep for several", param_hint="--workload")
    spec = resolve_spec(kw, [steps] if steps is not None else None, workloads)
    if kw["dry_run"]:
        print_dry_run(spec)
        return
    sys.exit(execute(spec, kw["quiet"]))


@cli.command()
@click.option("--steps", "steps_csv", help="Steps values to sweep, e.g. 0,1,2,3,4.")
@click.option("--grid", "grid", multiple=True, help="Server knob to sweep, KEY=V1,V2 (e.g. eagle_topk=1,2).")
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Continue an interrupted sweep in this run directory, skipping completed points.",
)
@click.option(
    "--redo-disturbed",
    is_flag=True,
    help="With --resume: also run again the complete points the measuring host disturbed (flagged "
    "client_saturated, schedule_slip, rate_shortfall, sim_behind or itl_read_bound); their old records move to "
    "superseded/.",
)
@settings_options(SearchSettings, "variable")
@slo_options
@settings_options(SearchSettings, "maximum", "tolerance")
@run_options
@click.pass_context
def sweep(
    ctx: click.Context,
    steps_csv: str | None,
    grid: tuple[str, ...],
    resume_dir: Path | None,
    redo_disturbed: bool,
    **kw: Any,
) -> None:
    """Run a grid of server configurations x workloads x load levels into one run directory."""
    from rig.tune.cli import SEARCH_PARAMS, resumed_planner, search_settings

    if redo_disturbed and resume_dir is None:
        raise click.UsageError("--redo-disturbed re-runs points of a run: give it with --resume DIR")
    if resume_dir is not None:
        if kw["variable"] is not None:
            raise click.UsageError("--resume continues the search recorded in the run; give it without --search")
        given = [
            p.opts[0]
            for p in ctx.command.params
            if p.name not in ("quiet", "dry_run", "resume_dir", "redo_disturbed")
            and ctx.get_parameter_source(p.name or "") is ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(f"--resume continues the run as it was specified; drop {', '.join(given)}")
        spec = resume_spec(resume_dir)
        if kw["dry_run"]:
            print_dry_run(spec)
            return
        from rig.contracts import DISTURBED_FLAGS
        from rig.results import load_manifest

        planner = resumed_planner(spec, load_manifest(resume_dir))
        if redo_disturbed and planner is not None:
            raise click.UsageError("--redo-disturbed is for grid sweeps: a search's points follow from its results")
        redo = DISTURBED_FLAGS if redo_disturbed else frozenset()
        sys.exit(execute(spec, kw["quiet"], resume_dir=resume_dir, planner=planner, redo=redo))
    settings = search_settings(ctx, {n: kw.pop(n) for n in SEARCH_PARAMS}, kw)
    steps = csv_ints("--steps", steps_csv)
    workloads = csv_workloads(kw["workload"])
    g: dict[str, list[Any]] = {}
    for item in grid:
        key, sep, values = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=V1,V2, got {item!r}", param_hint="--grid")
        g[key.strip().replace("-", "_")] = [yaml.safe_load(v) for v in values.split(",")]
    # with the rest of the spec: a command template's placeholders are checked against the grid's knobs
    spec = resolve_spec(kw, steps, workloads, {"server_grid": g} if g else None)
    if settings is not None and spec.load.profile:
        raise click.UsageError("--search varies one fixed level per probe; a load profile is one point: drop one")
    if kw["dry_run"]:
        print_dry_run(spec)
        return
    if settings is not None:
        from rig.tune.slo_search import search_planner

        sys.exit(execute(spec, kw["quiet"], planner=search_planner(spec, settings)))
    sys.exit(execute(spec, kw["quiet"]))


def resume_spec(run_dir: Path) -> RunSpec:
    """The spec of the run in ``run_dir``, or a one-line UsageError saying why that run cannot be resumed."""
    from pydantic import ValidationError

    from rig.config import RunSpec, _one_line
    from rig.results import load_manifest

    try:
        old = load_manifest(run_dir)
    except FileNotFoundError as e:
        raise click.UsageError(f"cannot resume: {e}") from None
    except (ValueError, OSError) as e:  # cut short (a full disk, a copy interrupted), unreadable or not a manifest
        raise click.UsageError(
            f"cannot resume {run_dir}: its manifest.json is unreadable "
            f"({str(e).splitlines()[0][:120]}); start a new run instead"
        ) from None
    if not isinstance(old.spec, dict):
        raise click.UsageError(f"cannot resume {run_dir}: its manifest.json holds no run spec")
    from rig.results import MASKED_CREDENTIALS

    if MASKED_CREDENTIALS in str((old.spec.get("server") or {}).get("url") or ""):
        raise click.UsageError(
            f"cannot resume {run_dir}: its server URL carried credentials, which rig does not "
            f"store; start a new run (send a key with --api-key-env or --api-key-file)"
        )
    try:
        return RunSpec.model_validate(old.spec)
    except ValidationError as e:
        raise click.UsageError(
            f"cannot resume {run_dir}: its spec is not valid for this rig ({_one_line(e)})"
        ) from None


@cli.command()
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path), required=True)
@click.option("--connect/--no-connect", default=True, help="Also check a reachable cluster's nodes.")
def check(cluster_file: Path, connect: bool) -> None:
    """Validate a cluster file and, when its cluster is reachable, check that its nodes match."""
    from rig.config import ClusterSpec
    from rig.placement import PlacementError, plan_placement
    from rig.placement import connect as ray_connect

    try:
        doc = load_yaml(cluster_file)
        if "cluster" not in doc:
            raise SpecError(f"{cluster_file}: no 'cluster:' mapping")
        spec = build_spec({"cluster": doc["cluster"], **({"server": doc["server"]} if "server" in doc else {})}, {})
    except SpecError as e:
        raise click.UsageError(str(e)) from None
    c: ClusterSpec = spec.cluster
    click.echo(f"{cluster_file}: valid ({'local Ray' if c.address is None else 'Ray at ' + c.address})")
    if not connect or c.address is None:
        return
    import ray

    from rig.placement import ClusterError

    try:
        layout = ray_connect(c, 1)
    except ClusterError as e:  # rig's own line: unreachable, or not Ray
        raise click.ClickException(str(e)) from None
    except Exception as e:  # unreachable cluster
        raise click.ClickException(f"cannot reach Ray at {c.address}: {str(e).splitlines()[0]}") from None
    try:
        from rig.server.engines import engine_for

        gpus = engine_for(spec.server.engine).num_gpus(spec.server)
        n_clients = len([n for n in layout.nodes if all(n.labels.get(k) == v for k, v in c.client_label.items())])
        placement = plan_placement(c, layout.nodes, gpus, max(1, n_clients * c.per_host if c.client_label else 1))
        click.echo(f"{len(layout.nodes)} nodes; server node ok; {len(placement.client_nodes)} client host(s)")
    except PlacementError as e:
        raise click.ClickException(str(e)) from None
    finally:
        ray.shutdown()


@cli.command("tune")
@click.option("--steps", "steps_csv", help="Steps values to choose from, e.g. 0,1,2,3,4.")
@slo_options
@settings_options(TuneSettings, "start_profile", "confidence", "max_rounds", "fit_evals")
@run_options
def tune(steps_csv: str | None, **kw: Any) -> None:
    """The best speculative setting for a load and an SLO: measure a few points per configuration, fit the
    simulator's model to them, predict every configuration's SLO boundary, measure only where that decides the
    answer, refit, and stop when the measured answer is stable. --concurrency gives the load levels to choose
    from. Resume an interrupted tune with `rig sweep --resume RUN_DIR`."""
    from rig.tune.cli import TUNE_PARAMS, tune_settings
    from rig.tune.planner import tune_planner

    settings = tune_settings({n: kw.pop(n) for n in TUNE_PARAMS}, kw)
    workloads = [kw["workload"]] if kw["workload"] else None
    if kw["workload"] and "," in kw["workload"]:
        raise click.BadParameter("rig tune answers for one workload", param_hint="--workload")
    spec = resolve_spec(kw, csv_ints("--steps", steps_csv), workloads)
    if spec.load.profile:
        raise click.UsageError("rig tune measures fixed levels; a load profile is one point (run it with rig run)")
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


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        click.echo(f"rig: error: {e.format_message()}", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        click.echo(f"rig: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
