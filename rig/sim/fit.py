"""Fit a profile's parameters to measurements by simulating each measured scenario in virtual time.

Targets come from the campaign's published figures (``campaign_targets``) or from a rig results directory of real
runs (``run_dir_targets``). The objective is the weighted sum of squared log-ratios sim/target; the optimiser is
Nelder-Mead over the free parameters (log-scaled where positive), from the profile's defaults, so a fit is
deterministic: the same inputs give the same profile.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shlex
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from rig.sim.capacity import StateFlags
from rig.sim.profile import SPEC_BY_NAME, Profile
from rig.sim.text import tokenize
from rig.sim.virtual import Scenario, engine_config, run_closed_loop, summarize

CAMPAIGN_DATA = Path(__file__).parent / "data" / "campaign.yaml"

# Parameters the campaign constrains; everything else keeps its stated value (fact or assumption).
CAMPAIGN_FREE = (
    "t_fixed_ms",
    "t_experts_ms",
    "c_tok_ms",
    "d_fixed_ms",
    "acc_logit_loop",
    "greedy_repeat_onset_tokens",
    "mamba_state_mb_per_req",
)
# Real runs constrain timing and acceptance (they carry per-request acceptance); capacity comes from the server log.
RUN_DIR_FREE = (
    "t_fixed_ms",
    "t_experts_ms",
    "c_tok_ms",
    "d_fixed_ms",
    "spec_fixed_ms",
    "host_chunk_ms",
    "acc_logit_greedy",
    "acc_logit_position_decay",
    "acc_logit_beyond_trained",
    "acc_logit_temperature_slope",
    "acc_logit_loop",
)
# A run directory's fit starts from the reference profile (a 122B MoE on Blackwell) whatever model and GPU the run
# had, so its parameters must travel factors of ten: its first simplex moves each one by a factor of two (a logit by
# 0.7), where scipy's own moves it by 5 % of its value (of its log here: 0.03 % for a value near 1 ms).
RUN_DIR_FIRST_STEP = math.log(2.0)
# logits are searched linearly; the rest in log space
_LINEAR = {
    "acc_logit_loop",
    "acc_logit_greedy",
    "acc_logit_position_decay",
    "acc_logit_beyond_trained",
    "acc_logit_temperature_slope",
}


@dataclass(frozen=True)
class Target:
    """One measured figure: a scenario, which metric of it, the measured value, and its weight in the objective."""

    label: str
    metric: str  # aggregate_tok_s | decode_tok_s | accept_length | mean_ttft_s | max_running | ratio
    value: float
    scenario: Scenario | None = None  # None for max_running (no simulation needed)
    steps: int = 0  # for max_running
    weight: float = 1.0
    state_flags: StateFlags | None = None  # for max_running: the launch flags that size the state pool
    ratio_of: tuple[str, str] | None = None  # metric = ratio: label_a / label_b of two other targets


@dataclass
class FitResult:
    profile: Profile
    rows: list[dict]  # label, metric, target, sim, rel_err
    objective: float
    evaluations: int
    free: tuple[str, ...] = field(default_factory=tuple)


def _spread(total: int, n: int) -> tuple[int, ...]:
    """n integers summing to total, as even as possible."""
    base, extra = divmod(total, n)
    return tuple(base + (1 if i < extra else 0) for i in range(n))


def campaign_workload(d: dict) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """Prompts (and per-prompt max_tokens) standing in for the campaign's templates: the rig's own greedy
    workload, rendered as the native API sends it, so a fit and a `rig run --workload greedy` see the same requests;
    the stand-ins in the data file if that workload is not importable."""
    try:
        from rig.workloads.base import render_messages
        from rig.workloads.greedy import TEMPLATES
    except ImportError:
        return tuple(d["prompts"]), None
    prompts = tuple(render_messages([{"role": "user", "content": t}]) for t, _ in TEMPLATES)
    return prompts, tuple(int(n) for _, n in TEMPLATES)


def campaign_flags(path: Path = CAMPAIGN_DATA) -> StateFlags:
    """The launch flags the campaign is assumed to have run with (campaign.yaml launch_flags)."""
    d = yaml.safe_load(Path(path).read_text())
    return StateFlags(**(d.get("launch_flags") or {}))


def campaign_targets(path: Path = CAMPAIGN_DATA) -> list[Target]:
    """The campaign's figures as targets, with the campaign client's behaviour (and launch flags) as scenarios."""
    d = yaml.safe_load(Path(path).read_text())
    prompts, lengths = campaign_workload(d)
    return [replace(t, scenario=replace(t.scenario, state_flags=campaign_flags(path)) if t.scenario else None,
                    state_flags=campaign_flags(path)) for t in _campaign_targets(d, prompts, lengths)]  # fmt: skip


def _campaign_targets(d: dict, prompts: tuple[str, ...], lengths: tuple[int, ...] | None) -> list[Target]:
    out: list[Target] = []
    rows = d["steps4_table"]
    for r in rows:
        c, n = int(r["concurrency"]), int(r["ok"])
        sc = Scenario(4, c, n, lengths or _spread(int(r["tokens"]), n), prompts, label=f"steps4 C={c}")
        out.append(Target(f"steps4 C={c} aggregate", "aggregate_tok_s", float(r["aggregate_tok_s"]), sc))
        out.append(Target(f"steps4 C={c} per-request", "decode_tok_s", float(r["per_request_tok_s"]), sc))
    c1 = next(r for r in rows if int(r["concurrency"]) == 1)
    base = float(c1["per_request_tok_s"]) / float(d["c1_speedup_vs_steps1"][4])
    for steps, ratio in sorted(d["c1_speedup_vs_steps1"].items()):
        if int(steps) == 4:
            continue  # already a row of the table
        sc = Scenario(int(steps), 1, 4, lengths or (1000,), prompts, label=f"steps{steps} C=1")
        out.append(Target(f"steps{steps} C=1 per-request", "decode_tok_s", base * float(ratio), sc))
    c64 = next(r for r in rows if int(r["concurrency"]) == 64)
    for steps, agg in sorted(d["c64_aggregate_tok_s"].items()):
        if int(steps) == 4:
            continue
        sc = Scenario(
            int(steps),
            64,
            int(c64["ok"]),
            lengths or _spread(int(c64["tokens"]), int(c64["ok"])),
            prompts,
            label=f"steps{steps} C=64",
        )
        out.append(Target(f"steps{steps} C=64 aggregate", "aggregate_tok_s", float(agg), sc))
    reg = d["c64_aggregate_tok_s"]
    out.append(
        Target(
            "C=64 aggregate steps4/steps3",
            "ratio",
            float(reg[4]) / float(reg[3]),
            weight=10.0,
            ratio_of=("steps4 C=64 aggregate", "steps3 C=64 aggregate"),
        )
    )
    for steps, mr in sorted(d["max_running_requests"].items()):
        # Read by hand from logs ("about 17"): a softer target than the throughput figures.
        out.append(
            Target(f"max_running_requests steps={steps}", "max_running", float(mr), steps=int(steps), weight=0.5)
        )
    return out


def run_dir_targets(run_dir: Path | str) -> list[Target]:
    """Targets from a rig results directory: per point (closed loop, one fixed steps value), its aggregate and
    decode tok/s and acceptance length, replayed with the same request count and output lengths under the startup
    limits its server reported. Points of a server that ran the engine's adaptive controller (a rig prove arm) are
    left out: a scenario replays fixed steps."""
    from rig.results import read_requests  # the only reader of the rig's Parquet

    df = read_requests(run_dir).to_pandas()
    df = df[df["ok"].fillna(False).astype(bool)]
    if df.empty:
        raise ValueError(f"{run_dir}: no successful requests to fit to")
    servers, adaptive = _server_limits(Path(run_dir))
    out: list[Target] = []
    seen: dict[str, int] = {}
    filler = "Explain how this system works in detail."  # prompt text is not recorded; a neutral stand-in
    # One point at a time: two servers at the same steps (a prove run's static and schedule arms) or two repeats
    # are two measurements, never one pooled over both windows.
    for _, g in df.groupby("point", sort=True):
        conc, temp = g["concurrency"].iloc[0], g["temperature"].iloc[0]
        if not conc or math.isnan(conc) or g["server_config"].iloc[0] in adaptive:
            continue  # open-loop points are not replayed by the closed-loop client; adaptive ones not as fixed steps
        steps, conc = int(g["steps"].iloc[0]), int(conc)
        temp = 0.0 if temp is None or math.isnan(temp) else float(temp)
        lens = tuple(int(x) for x in g["completion_tokens"])
        prompts = _stand_in_prompts(g["prompt_tokens"], filler)
        # The limits the server reported at startup: a real server's capacity is a fact of its run (SGLang: 4,096
        # running requests plain, 48 under speculation, on the 0.28 B model), not the profile's model of the
        # reference hardware's memory. Its TP is not replayed: the profile's weights are the reference model's
        # (244 GB at TP 1), and the fitted costs stand for the run's per step.
        limits = servers.get(str(g["server_config"].iloc[0]), {})
        sc = Scenario(
            steps,
            conc,
            len(g),
            lens,
            prompts,
            temperature=temp,
            ignore_eos=True,
            label=f"s{steps} C={conc}",
            max_running=limits.get("max_running"),
            kv_pool_tokens=limits.get("kv_pool_tokens"),
        )
        label = f"steps{steps} C={conc} T={temp:g}"
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            label += f" #{seen[label]}"
        wall = float(g["end_ts"].max() - g["send_ts"].min())
        out.append(Target(f"{label} aggregate", "aggregate_tok_s", float(g["completion_tokens"].sum()) / wall, sc))
        dec = g[(g["completion_tokens"] > 1) & (g["e2e_s"] > g["ttft_s"])]
        if len(dec):
            v = ((dec["completion_tokens"] - 1) / (dec["e2e_s"] - dec["ttft_s"])).mean()
            out.append(Target(f"{label} per-request", "decode_tok_s", float(v), sc))
        if steps > 0 and "spec_accept_length" in g and g["spec_accept_length"].notna().any():
            al = float(g["spec_accept_length"].dropna().mean())
            out.append(Target(f"{label} accept length", "accept_length", al, sc, weight=0.5))
    if not out:
        raise ValueError(f"{run_dir}: no closed-loop points to fit to")
    return out


def _stand_in_prompts(prompt_tokens: Iterable[float | None], filler: str) -> tuple[str, ...]:
    """One prompt per request with its recorded prompt length (the text is not recorded): a request's prompt length
    sets its prefill and every decode step's attention cost (the realistic workload's average 483 tokens against
    greedy's 83 on the 2026-12-07 run). The words never repeat, so no two prompts share a cached prefix and the
    content reads as the filler sentence does (its share of punctuation, no repeated bigrams): repeating the
    filler made every long prompt 'repetitive text' to the simulator, whose acceptance then rose 45 %."""
    words = tokenize(filler)
    punct = {k for k, w in enumerate(words) if not w.isalnum()}
    out = []
    for i, recorded in enumerate(prompt_tokens):
        n = len(words) if recorded is None or math.isnan(recorded) else int(recorded)
        toks = [words[k % len(words)] if k % len(words) in punct else f"w{i}n{k}" for k in range(max(n, 1))]
        out.append(" ".join(toks))
    return tuple(out)


def _server_limits(run_dir: Path) -> tuple[dict[str, dict[str, int]], set[str]]:
    """Each real server configuration's startup limits, by its id; and the ids of those that ran the engine's
    adaptive controller."""
    import json

    try:
        configs = json.loads((run_dir / "manifest.json").read_text()).get("server_configs") or {}
    except (OSError, ValueError):
        return {}, set()
    limits_of: dict[str, dict[str, int]] = {}
    adaptive: set[str] = set()
    for cid, c in configs.items():
        knobs, startup = c.get("knobs") or {}, c.get("startup") or {}
        if c.get("adaptive") or "--speculative-adaptive" in (knobs.get("extra_args") or []):
            adaptive.add(cid)
        if knobs.get("engine") == "sim":
            continue  # a simulated run's limits are the profile's own
        limits: dict[str, int] = {}
        if startup.get("max_running_requests"):
            limits["max_running"] = int(startup["max_running_requests"])
        if startup.get("max_total_num_tokens"):
            limits["kv_pool_tokens"] = int(startup["max_total_num_tokens"])
        if limits:
            limits_of[cid] = limits
    return limits_of, adaptive


def _simulate(job: tuple[Profile, list[Scenario]]) -> list[dict[str, float]]:
    """Some scenarios' figures (a module-level function, so worker processes can run it)."""
    profile, scenarios = job
    return [summarize(run_closed_loop(profile, sc)) for sc in scenarios]


def simulate_scenarios(
    profile: Profile, scenarios: Iterable[Scenario], pool: ProcessPoolExecutor | None = None, workers: int = 1
) -> dict[Scenario, dict[str, float]]:
    """Every distinct scenario simulated once, split over ``workers`` processes of ``pool`` when given (each run is
    deterministic, so the figures do not depend on where it ran). One batch per worker, balanced by cost: a task
    per scenario would spend more on pickling than the small scenarios take to simulate."""
    todo = sorted(set(scenarios), key=lambda sc: sc.n_requests * sc.concurrency, reverse=True)
    if pool is None or workers < 2 or len(todo) < 2:
        return dict(zip(todo, _simulate((profile, todo)), strict=False))
    bins: list[list[Scenario]] = [[] for _ in range(min(workers, len(todo)))]
    load = [0] * len(bins)
    for sc in todo:  # longest first, each to the least-loaded batch
        i = load.index(min(load))
        bins[i].append(sc)
        load[i] += sc.n_requests * sc.concurrency
    out: dict[Scenario, dict[str, float]] = {}
    for batch, figures in zip(bins, pool.map(_simulate, [(profile, b) for b in bins]), strict=False):
        out.update(zip(batch, figures, strict=False))
    return out


def evaluate(
    profile: Profile, targets: Iterable[Target], pool: ProcessPoolExecutor | None = None, workers: int = 1
) -> list[dict]:
    """Simulate every scenario once (over ``pool``'s ``workers`` when given) and compare each target with it."""
    targets = list(targets)
    cache = simulate_scenarios(
        profile,
        [t.scenario for t in targets if t.metric not in ("ratio", "max_running") and t.scenario is not None],
        pool,
        workers,
    )
    sims: dict[str, float] = {}
    rows = []
    for t in targets:
        if t.metric == "ratio":
            continue
        if t.metric == "max_running":
            sim = float(engine_config(profile, t.steps, state_flags=t.state_flags).max_running)
        else:
            assert t.scenario is not None
            sim = cache[t.scenario][t.metric]
        sims[t.label] = sim
        rows.append(_row(t, sim))
    for t in targets:
        if t.metric == "ratio" and t.ratio_of:
            a, b = t.ratio_of
            rows.append(_row(t, sims[a] / sims[b] if sims.get(b) else float("nan")))
    return rows


def fit_workers() -> int:
    """Processes a fit simulates scenarios on: the CPUs this process may use (RIG_FIT_WORKERS overrides)."""
    env = os.environ.get("RIG_FIT_WORKERS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _row(t: Target, sim: float) -> dict:
    rel = (sim - t.value) / t.value if t.value else float("nan")
    return {"label": t.label, "metric": t.metric, "target": t.value, "sim": sim, "rel_err": rel, "weight": t.weight}


def objective(rows: list[dict]) -> float:
    total = 0.0
    for r in rows:
        if r["sim"] <= 0 or not math.isfinite(r["sim"]):
            total += r["weight"] * 25.0
        else:
            total += r["weight"] * math.log(r["sim"] / r["target"]) ** 2
    return total


def fit(
    targets: list[Target],
    start: Profile | None = None,
    free: tuple[str, ...] = CAMPAIGN_FREE,
    max_evals: int = 1500,
    progress: Callable[[int, float], None] | None = None,
    first_step: float | None = None,
) -> FitResult:
    """Minimise the objective over the free parameters, within each parameter's bounds.

    ``first_step``: None keeps scipy's first simplex; a number moves each parameter by that much in its search space
    (log or linear) for the first simplex, and by half of it for the restart.
    """
    from scipy.optimize import minimize

    base = start or Profile.defaults()
    specs = [SPEC_BY_NAME[n] for n in free]

    def to_x(p: Profile) -> np.ndarray:
        # a log-space parameter stated as 0 (spec_fixed_ms in the reference profile) starts a little above it
        return np.array(
            [p.values[s.name] if s.name in _LINEAR else math.log(max(p.values[s.name], s.hi * 1e-3)) for s in specs]
        )

    def from_x(x: np.ndarray) -> Profile:
        vals = {}
        for s, v in zip(specs, x, strict=False):
            val = float(v) if s.name in _LINEAR else math.exp(float(v))
            vals[s.name] = min(max(val, s.lo), s.hi)
        return base.with_values(**vals)

    bounds = [(s.lo, s.hi) if s.name in _LINEAR else (math.log(max(s.lo, 1e-9)), math.log(s.hi)) for s in specs]
    n_evals = 0

    workers = fit_workers()
    # Worker processes are started fresh (spawn): the fit may run inside a process that already has threads.
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) if workers > 1 else None

    def f(x: np.ndarray) -> float:
        nonlocal n_evals
        n_evals += 1
        val = objective(evaluate(from_x(x), targets, pool, workers))
        if progress:  # every evaluation: the caller decides how often to show it (rig.sim.fit_progress)
            progress(n_evals, val)
        return val

    x0 = to_x(base)
    first = {} if first_step is None else {"initial_simplex": _simplex(x0, bounds, first_step)}
    try:
        best = minimize(
            f,
            x0,
            method="Nelder-Mead",
            bounds=bounds,
            options={"maxfev": max_evals, "xatol": 1e-4, "fatol": 1e-7, "adaptive": True, **first},
        )
        # A restart from the optimum escapes a collapsed simplex (common with piecewise-constant terms).
        again = {} if first_step is None else {"initial_simplex": _simplex(best.x, bounds, first_step / 2)}
        best = minimize(
            f,
            best.x,
            method="Nelder-Mead",
            bounds=bounds,
            options={"maxfev": max_evals, "xatol": 1e-5, "fatol": 1e-8, "adaptive": True, **again},
        )
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    prof = from_x(best.x)
    rows = evaluate(prof, targets)
    return FitResult(prof, rows, objective(rows), n_evals, tuple(free))


def _simplex(x0: np.ndarray, bounds: list[tuple[float, float]], step: float) -> np.ndarray:
    """Nelder-Mead's first simplex: x0 and, per parameter, x0 moved by ``step`` (downwards where up leaves bounds)."""
    verts = [np.array(x0, dtype=float)]
    for i, (lo, hi) in enumerate(bounds):
        v = verts[0].copy()
        v[i] = v[i] + step if v[i] + step <= hi else max(v[i] - step, lo)
        verts.append(v)
    return np.array(verts)


def fitted_profile(result: FitResult, name: str, command: list[str], data_note: str) -> Profile:
    """Attach provenance to a fit's profile: the command, the data, per-target quality, and which values were fitted."""
    p = result.profile
    sources = {n: p.sources.get(n, "assumption") for n in SPEC_BY_NAME}
    for n in result.free:
        sources[n] = "fitted"
    notes = dict(p.notes)
    notes.update(
        {
            "produced_by": shlex.join(command),
            "fitted_to": data_note,
            "fit_objective": round(result.objective, 6),
            "fit_quality": [
                {
                    "target": r["label"],
                    "measured": round(r["target"], 4),
                    "simulated": round(r["sim"], 4),
                    "rel_err_pct": round(100 * r["rel_err"], 2),
                }
                for r in result.rows
            ],
        }
    )
    return Profile(dict(p.values), name=name, notes=notes, sources={**p.sources, **sources})
