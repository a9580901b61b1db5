"""`rig sweep --search concurrency|rate --slo ...`: per server configuration and workload, the largest load whose
point meets every SLO, found by bracketing and bisection; each probe is an ordinary point of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from rig.analysis.metrics import parse_slo
from rig.analysis.slo import describe
from rig.config import RunSpec
from rig.contracts import Probe, ProbeSummary, SearchProbe, SearchResult, SearchSection, SearchSettings
from rig.run.points import Point, point_id
from rig.run.runner import Runner
from rig.server.spec import ServerConfig
from rig.tune.probe import read_probe
from rig.tune.search import Bisection, Domain, IntDomain, RateDomain
from rig.workloads.spec import WorkloadSpec


def domain(settings: SearchSettings) -> Domain:
    """The values a search with these settings may probe."""
    if settings.variable == "concurrency":
        return IntDomain(1, int(settings.top()))
    return RateDomain(min(0.05, settings.start), float(settings.top()), settings.tolerance)


def make_point(spec: RunSpec, cfg: ServerConfig, wl: WorkloadSpec, variable: str, value: float) -> Point:
    """The ordinary point a probe at ``value`` is (same id scheme as a grid sweep, so --resume finds it)."""
    if variable == "concurrency":
        c = int(value)
        return Point(point_id(cfg, wl, c, None, "closed", 0), cfg, wl, c, None, 0)
    cap = spec.load.max_concurrency
    return Point(point_id(cfg, wl, cap, float(value), spec.load.mode, 0), cfg, wl, cap, float(value), 0)


def _probe_at(probes: dict[float, Probe], value: float | None) -> Probe | None:
    """The probe taken at ``value`` (None when the search has no such bound yet)."""
    return probes.get(value) if value is not None else None


def summary_probe(probe: Probe | None) -> ProbeSummary | None:
    """What the manifest keeps of a bound's probe (JSON)."""
    return probe.summary() if probe is not None else None


def search_planner(spec: RunSpec, settings: SearchSettings) -> Callable[[Runner], Iterator[Point]]:
    """A planner for Runner: one bisection per (server configuration, workload), probes run as they are chosen."""
    slos = [parse_slo(t) for t in settings.slos]

    def plan(runner: Runner) -> Iterator[Point]:
        section = runner.manifest.search = runner.manifest.search or SearchSection()
        section.settings = settings
        section.describe = describe(slos, settings.percentile)
        section.results = []
        for cfg in spec.server_configs():
            for wl in spec.workloads:
                start = int(settings.start) if settings.variable == "concurrency" else settings.start
                b = Bisection(domain(settings), start)
                res = SearchResult(
                    server_config=cfg.config_id(), steps=cfg.steps, workload=wl.name, variable=settings.variable
                )
                section.results.append(res)
                probes: dict[float, Probe] = {}
                while (v := b.next()) is not None:
                    p = make_point(spec, cfg, wl, settings.variable, v)
                    yield p
                    probe = read_probe(runner.run_dir, p.point, slos, settings.percentile)
                    if probe is None:
                        res.status, res.error = "error", runner.entry(p.point).error or "no rows"
                        break
                    probes[v] = probe
                    b.record(v, probe.meets)
                    res.probes += 1
                    res.probe_points.append(SearchProbe(value=v, point=p.point, meets=probe.meets, margin=probe.margin))
                    res.max_passing = summary_probe(_probe_at(probes, b.max_passing))
                    res.min_failing = summary_probe(_probe_at(probes, b.min_failing))
                    runner.save()
                if res.status != "error":
                    res.status = b.outcome
                runner.save()

    return plan
