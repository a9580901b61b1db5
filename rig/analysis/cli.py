"""Click commands ``report`` and ``compare`` (mounted on the main CLI with ``cli.add_command``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rig.analysis.gate import Threshold, parse_threshold
from rig.analysis.metrics import Slo, parse_slo
from rig.analysis.runs import AnalysisInputError
from rig.cli_settings import settings_option
from rig.contracts import DEFAULT_PERCENTILE, SloSettings

if TYPE_CHECKING:
    from rig.analysis.rows import EnergyRatioRow, GateRow, LevelBest, SpeedupRow


def _slos(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Slo]:
    try:
        return [parse_slo(v) for v in values]
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


class Price(click.FloatRange):
    """A price in USD: a finite number >= 0 (click's FloatRange lets nan and inf through, and they would print as a
    cost)."""

    name = "price"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a price (give a finite number of USD, e.g. 2.5)", param, ctx)
        return rv


class InputError(click.ClickException):
    """One line, exit 2: the arguments name no usable run or comparison."""

    exit_code = 2


def _fail(e: Exception) -> click.ClickException:
    """A AnalysisInputError is about what the user gave (no such run, nothing to compare): exit 2; I/O faults exit 1."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, OSError) and e.strerror:  # 'cannot write x: Is a directory', not '[Errno 21] ...'
        msg = f"cannot write {e.filename}: {e.strerror}" if e.filename else e.strerror
    return InputError(msg) if isinstance(e, AnalysisInputError) else click.ClickException(msg)


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the campaign table as a JSON list (one object per point).")
@click.option("--csv", "csv_dir", type=click.Path(path_type=Path), help="Write every table as CSV into DIR.")
@click.option(
    "--plots", "plots_dir", type=click.Path(path_type=Path), help="Write the plots into DIR (PNG at 2x and SVG)."
)
@click.option("--html", "html_file", type=click.Path(path_type=Path), help="Write one self-contained HTML page.")
@settings_option(SloSettings, "slos", callback=_slos)
@settings_option(
    SloSettings,
    "percentile",
    "slo_percentile",
    own_default=f"{DEFAULT_PERCENTILE:g}, or the search's or tune's when the run was one",
)
@click.option(
    "--slo-cancelled",
    type=click.Choice(["excluded", "lower-bound"]),
    default="excluded",
    show_default=True,
    help="How SLO verdicts count cancelled requests: left out, or at their known minimum (the time they ran "
    "before they were cancelled; TTFT: their first token's time if one came).",
)
@click.option(
    "--json-full",
    "json_full",
    is_flag=True,
    help="Print every section as one JSON object (campaign rows, frontier, best per level and per SLO, "
    "SLO search, tune).",
)
@click.option(
    "--thresholds",
    metavar="NAME=VALUE,...",
    help="Judge point validity again with these thresholds instead of the ones the run recorded, e.g. "
    "--thresholds slip_p99_ms=20,cpu_pct=80 (names: slip_p99_ms, loop_lag_p99_ms, cpu_pct, "
    "rate_ratio, min_window_s).",
)
@click.option(
    "--gpu-hour-price",
    type=Price(min=0),
    metavar="USD",
    help="Price of one GPU-hour: adds $ per million output tokens (default: the cluster file's "
    "gpu_hour_price, if the run recorded one).",
)
@click.option(
    "--objective",
    type=click.Choice(["throughput", "j_per_token", "usd_per_mtok"]),
    default="throughput",
    show_default=True,
    help="What the speculative schedule by load ranks settings by (each under the SLOs).",
)
@click.option(
    "--timeline-window",
    "timeline_window_s",
    type=click.FloatRange(min=0.1, max=3600),
    default=5.0,
    show_default=True,
    help="Seconds per window of a load profile's timeline (points run with --load-profile / --rate-profile).",
)
@click.option(
    "--engine-schedule",
    "engine_dir",
    type=click.Path(path_type=Path),
    help="Write the schedule by running batch as engine config files into DIR: vLLM's --speculative-config "
    "(num_speculative_tokens_per_batch_size) and SGLang's --speculative-adaptive-config.",
)
def report(
    run_dir: Path,
    as_json: bool,
    csv_dir: Path | None,
    plots_dir: Path | None,
    html_file: Path | None,
    slos: list[Slo],
    slo_percentile: float | None,
    json_full: bool,
    thresholds: str | None,
    gpu_hour_price: float | None,
    objective: str,
    engine_dir: Path | None = None,
    slo_cancelled: str = "excluded",
    timeline_window_s: float = 5.0,
) -> None:
    """Tables, percentiles, acceptance, server state, goodput and losslessness of RUN_DIR, from Parquet alone."""
    from rig.analysis.report import build_report, export_csv, full_json, to_json

    err = Console(stderr=True)
    from rig.results import run_file_clash

    for flag, out in (
        ("--html", html_file),
        ("--csv", csv_dir),
        ("--plots", plots_dir),
        ("--engine-schedule", engine_dir),
    ):
        clash = run_file_clash(out) if out is not None else None
        if clash:  # checked before anything is read or written: the run must stay readable
            raise InputError(f"{flag} {out}: {clash}; rig never writes over a run's own files (choose another path)")
    try:
        cheap = not (csv_dir or plots_dir or html_file or slos or json_full or engine_dir)
        if as_json and cheap and objective == "throughput":
            # The campaign table alone is much cheaper than the whole report (no ITL, no losslessness).
            from rig.analysis.runs import load_run
            from rig.analysis.tables import campaign_table

            run = load_run(run_dir, thresholds)
            rows = campaign_table(run, gpu_hour_price)
            for w in run.warnings:
                err.print(f"[yellow]! {w}[/yellow]")
            click.echo(to_json(rows))
            return
        rep = build_report(
            run_dir,
            slos=slos,
            slo_percentile=slo_percentile,
            thresholds=thresholds,
            gpu_hour_price=gpu_hour_price,
            objective=objective,
            slo_cancelled=slo_cancelled,
            cdf_resolution=200 if plots_dir or html_file else 0,
            timeline_window_s=timeline_window_s,
        )  # CDFs are drawn, never printed

    except (AnalysisInputError, OSError, ValueError) as e:
        raise _fail(e) from None
    if as_json or json_full:
        for w in rep.warnings:
            err.print(f"[yellow]! {w}[/yellow]")
        click.echo(to_json(full_json(rep) if json_full else rep.campaign))
    else:
        from rig.analysis.render import render_report

        Console(width=max(Console().width, 160) if not sys.stdout.isatty() else None).print(render_report(rep))
    written: list[Path] = []
    try:
        if csv_dir:
            written += export_csv(rep, csv_dir)
        if engine_dir:
            from rig.analysis.engine_schedule import write_engine_files

            written += write_engine_files(rep.engine_schedule, engine_dir)
        svgs = None
        if plots_dir:
            from rig.analysis.plots import write_plots

            drawn = write_plots(rep, plots_dir, formats=("png", "svg"))
            written += drawn
            svgs = [p for p in drawn if p.suffix == ".svg"]
        if html_file:
            from rig.analysis.html import render_html

            html_file.parent.mkdir(parents=True, exist_ok=True)
            html_file.write_text(render_html(rep, svgs))  # the same figures, not drawn twice
            written.append(html_file)
    except OSError as e:
        raise _fail(e) from None
    if written:
        err.print(
            f"wrote {len(written)} file(s): "
            + ", ".join(str(p) for p in written[:6])
            + (" …" if len(written) > 6 else "")
        )


def _speedup_table(rows: list[SpeedupRow]) -> Table:
    t = Table(
        title="Paired per-request speedups (geometric mean, bootstrap 95% CI; > 1 = candidate faster)",
        title_justify="left",
        header_style="bold",
    )
    for c in ("Baseline", "Candidate", "Workload", "Level", "Metric", "Pairs", "Speedup", "95% CI", "Median", "Inputs"):
        t.add_column(c, justify="right" if c in ("Pairs", "Speedup", "95% CI", "Median", "Level") else "left")
    last = None
    for r in rows:
        key = (r["baseline"], r["candidate"])
        if last is not None and key != last:
            t.add_section()
        level = r["concurrency"] if r["load_mode"] in (None, "closed") else r["rate"]
        ci = f"{r['ci_low']:.3f}–{r['ci_high']:.3f}" if r["ci_low"] is not None else "–"
        t.add_row(
            r["baseline"] if key != last else "",
            r["candidate"] if key != last else "",
            str(r["workload"]),
            str(level),
            r["metric"],
            f"{r['pairs']:,}",
            f"{r['speedup']:.3f}" if r["speedup"] else "–",
            ci,
            f"{r['median_ratio']:.3f}" if r["median_ratio"] else "–",
            _inputs_cell(r),
        )
        last = key
    return t


def _inputs_cell(row: SpeedupRow | LevelBest | EnergyRatioRow) -> Text:
    """'ok', or '! incomplete: ...' in red next to a figure whose inputs lack records."""
    if not row.get("incomplete"):
        return Text("ok", style="green")
    return Text(f"! incomplete: {row['incomplete']}", style="bold red")


def _best_table(rows: list[LevelBest]) -> Table:
    t = Table(
        title="Best configuration per load level (aggregate tok/s; margin over the runner-up, 95% CI)",
        title_justify="left",
        header_style="bold",
    )
    for c in (
        "Workload",
        "Level",
        "Best",
        "Agg tok/s",
        "Runner-up",
        "Agg tok/s ",
        "Margin",
        "95% CI",
        "CI from",
        "Inputs",
    ):
        t.add_column(c, justify="right" if c.strip() in ("Agg tok/s", "Margin", "95% CI", "Level") else "left")
    for r in rows:
        level = r["concurrency"] if r["load_mode"] in (None, "closed") else r["rate"]
        pct = lambda x: f"{x * 100:+.1f}%" if x is not None else "–"  # noqa: E731
        t.add_row(
            str(r["workload"]),
            str(level),
            r["best"],
            f"{r['best_aggregate_tok_s']:,.1f}",
            r["runner_up"] or "–",
            f"{r['runner_up_aggregate_tok_s']:,.1f}" if r["runner_up_aggregate_tok_s"] else "–",
            pct(r["margin"]),
            f"{pct(r['ci_low'])} … {pct(r['ci_high'])}" if r["ci_low"] is not None else "–",
            r["ci_method"] or "–",
            _inputs_cell(r),
        )
    return t


def _thresholds(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Threshold]:
    try:
        return [parse_threshold(v) for v in values]
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


_VERDICT_STYLE = {"fail": ("FAIL", "bold red"), "waived": ("waived", "yellow"), "pass": ("pass", "green")}


def _gate_line(g: GateRow) -> Text:
    """'FAIL  tpot_p99 <= +3.0%  A:p -> B:p: +5.2% (95% CI ...): why' (one per check: pair and metric, inputs,
    coverage)."""
    from rig.analysis.gate_inputs import INPUT_CHECKS

    label, style = _VERDICT_STYLE.get(g["verdict"], ("pass", "green"))
    line = Text(label, style=style)
    bound = f" <= +{g['threshold']:.1%}" if g["metric"] not in INPUT_CHECKS and g["threshold"] is not None else ""
    pair = f"{g['baseline'] or '(none)'} -> {g['candidate'] or '(none)'}: " if g["baseline"] or g["candidate"] else ""
    line.append(f"  {g['metric']}{bound}  {pair}{g['why']}")
    if g.get("incomplete"):
        line.append(f"  ! incomplete: {g['incomplete']}", style="bold red")
    return line


@click.command("compare")
@click.argument("a")
@click.argument("b", required=False)
@click.option("--baseline-steps", type=int, help="One run: compare every point against its steps=N point.")
@click.option(
    "--resamples", type=click.IntRange(100, 100000), default=2000, show_default=True, help="Bootstrap resamples."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option(
    "--gpu-hour-price",
    type=Price(min=0),
    metavar="USD",
    help="Price of one GPU-hour: adds the $ per million output tokens ratio (default: the cluster file's).",
)
@click.option(
    "--max-regression",
    "max_regression",
    multiple=True,
    callback=_thresholds,
    metavar="METRIC[_STAT]=PCT%",
    help="CI gate: exit 1 only when the candidate is worse than this with 95% confidence (paired "
    "bootstrap interval entirely beyond it), e.g. --max-regression tpot_p99=3% (metrics: ttft, tpot, "
    "e2e, decode_tok_s; stats: mean (default), p50, p90, p95, p99, gm). One line per metric says why. The gate "
    "also fails what it cannot vouch for: requests the baseline served ok that the candidate failed or lacks "
    "(failed=PCT% tolerates a share of failed ones; 0 by default), points flagged invalid or incomplete, levels "
    "or configurations either side lacks.",
)
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="With --max-regression: judge only what is there; missing requests, flagged or incomplete points, absent "
    "levels and pairs with nothing to judge are shown as waived instead of failing the gate (failed requests "
    "still fail it: see failed=PCT%).",
)
def compare(
    a: str,
    b: str | None,
    baseline_steps: int | None,
    resamples: int,
    seed: int,
    as_json: bool,
    gpu_hour_price: float | None,
    max_regression: list[Threshold],
    allow_incomplete: bool = False,
) -> None:
    """Paired speedups of B over baseline A (runs, or RUN_DIR:POINT), or of one run's points over --baseline-steps."""
    from rig.analysis.compare import compare as run_compare
    from rig.analysis.report import to_json

    if allow_incomplete and not max_regression:
        raise InputError("--allow-incomplete waives the gate's input checks: give --max-regression too")
    try:
        result = run_compare(a, b, baseline_steps, resamples, seed, gpu_hour_price, max_regression, allow_incomplete)
    except (AnalysisInputError, OSError, ValueError) as e:
        raise _fail(e) from None
    err = Console(stderr=True)
    for w in result["warnings"]:
        err.print(f"[yellow]! {w}[/yellow]")
    failed = any(g["verdict"] == "fail" for g in result.get("gate", []))
    if as_json:
        click.echo(to_json(result))
        if failed:  # stdout is the JSON's: the reasons go to stderr, one line each
            for g in result["gate"]:
                if g["verdict"] == "fail":
                    err.print(_gate_line(g), highlight=False, soft_wrap=True)
    else:
        out = Console(width=max(Console().width, 160) if not sys.stdout.isatty() else None)
        out.print(f"[bold]Compare: {result['mode']}[/bold]  ({result['resamples']} resamples, seed {result['seed']})")
        out.print(_speedup_table(result["speedups"]))
        out.print(_best_table(result["best"]))
        if result.get("energy"):
            out.print(_energy_table(result["energy"]))
        for g in result.get("gate", []):
            out.print(_gate_line(g), highlight=False, soft_wrap=True)
        if result.get("gate"):
            from rig.analysis.gate_inputs import summary

            out.print(summary(result["gate"]), style="bold red" if failed else None, highlight=False)
    if failed:
        raise SystemExit(1)


def _energy_table(rows: list[EnergyRatioRow]) -> Table:
    sim = any("simulated" in str(r.get("source") or "") for r in rows)
    t = Table(
        title="Energy and cost, candidate / baseline (paired requests resampled, bootstrap 95% CI; < 1 = "
        "candidate spends less)" + (" — SIMULATED: the simulator's power model" if sim else ""),
        title_justify="left",
        header_style="bold",
        title_style="bold yellow" if sim else None,
    )
    for c in (
        "Baseline",
        "Candidate",
        "Workload",
        "Level",
        "Metric",
        "Baseline value",
        "Candidate value",
        "Ratio",
        "95% CI",
        "Pairs",
        "Inputs",
    ):
        t.add_column(c, justify="left" if c in ("Baseline", "Candidate", "Workload", "Metric", "Inputs") else "right")
    for r in rows:
        level = r["concurrency"] if r["load_mode"] in (None, "closed") else r["rate"]
        ci = f"{r['ci_low']:.3f}–{r['ci_high']:.3f}" if r["ci_low"] is not None else "–"
        spec = ",.3f"
        t.add_row(
            r["baseline"],
            r["candidate"],
            str(r["workload"]),
            str(level),
            r["metric"],
            format(r["baseline_value"], spec) if r["baseline_value"] is not None else "–",
            format(r["candidate_value"], spec) if r["candidate_value"] is not None else "–",
            f"{r['ratio']:.3f}" if r["ratio"] is not None else "–",
            ci,
            f"{r['pairs']:,}",
            _inputs_cell(r),
        )
    return t
