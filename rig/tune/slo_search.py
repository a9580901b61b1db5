"""`rig sweep --search concurrency|rate --slo ...`: per server configuration and workload, the largest load whose
point meets every SLO, found by bracketing and bisection; each probe is an ordinary point of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from rig.analysis.metrics import Slo, parse_slo
from rig.analysis.slo import DEFAULT_PERCENTILE, describe
from rig.config import RunSpec
from rig.contracts import Probe
from rig.run.points import Point, point_id
from rig.run.runner import Runner
from rig.server.spec import ServerConfig
from rig.tune.probe import read_probe
from rig.tune.search import MAX_CONCURRENCY, Bisection, Domain, IntDomain, RateDomain
from rig.workloads.spec import WorkloadSpec


@dataclass(frozen=True)
class SearchSettings:
    """What a search looks for; stored in the manifest so ``--resume`` repeats the same search."""

    variable: str  # concurrency | rate
    slos: tuple[str, ...]  # parse_slo text
    percentile: float = DEFAULT_PERCENTILE
    start: float = 1
    maximum: float = MAX_CONCURRENCY
    tolerance: float = 0.1  # rate only: stop when failing / passing <= 1 + tolerance

    def domain(self) -> Domain:
        if self.variable == "concurrency":
            return IntDomain(1, int(self.maximum))
        return RateDomain(min(0.05, self.start), float(self.maximum), self.tolerance)

    def parsed_slos(self) -> list[Slo]:
        return [parse_slo(s) for s in self.slos]

    @classmethod
    def from_manifest(cls, d: dict[str, Any]) -> SearchSettings:
        return cls(**{**d, "slos": tuple(d["slos"])})


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


def summary_probe(probe: Probe | None) -> dict[str, Any] | None:
    """What the manifest keeps of a bound's probe (JSON)."""
    return probe.summary() if probe is not None else None


def search_planner(spec: RunSpec, settings: SearchSettings) -> Callable[[Runner], Iterator[Point]]:
    """A planner for Runner: one bisection per (server configuration, workload), probes run as they are chosen."""
    slos = settings.parsed_slos()

    def plan(runner: Runner) -> Iterator[Point]:
        section = runner.manifest.search = runner.manifest.search or {}
        section["settings"] = asdict(settings) | {"slos": list(settings.slos)}
        section["describe"] = describe(slos, settings.percentile)
        results: list[dict[str, Any]] = []
        section["results"] = results
        for cfg in spec.server_configs():
            for wl in spec.workloads:
                start = int(settings.start) if settings.variable == "concurrency" else settings.start
                b = Bisection(settings.domain(), start)
                res: dict[str, Any] = {
                    "server_config": cfg.config_id(),
                    "steps": cfg.steps,
                    "workload": wl.name,
                    "variable": settings.variable,
                    "status": "searching",
                    "probes": 0,
                    "probe_points": [],
                    "max_passing": None,
                    "min_failing": None,
                    "error": None,
                }
                results.append(res)
                probes: dict[float, Probe] = {}
                while (v := b.next()) is not None:
                    p = make_point(spec, cfg, wl, settings.variable, v)
                    yield p
                    probe = read_probe(runner.run_dir, p.point, slos, settings.percentile)
                    if probe is None:
                        res.update(status="error", error=runner.entry(p.point).error or "no rows")
                        break
                    probes[v] = probe
                    b.record(v, probe.meets)
                    res["probes"] += 1
                    res["probe_points"].append(
                        {"value": v, "point": p.point, "meets": probe.meets, "margin": probe.margin}
                    )
                    res.update(
                        max_passing=summary_probe(_probe_at(probes, b.max_passing)),
                        min_failing=summary_probe(_probe_at(probes, b.min_failing)),
                    )
                    runner.save()
                if res["status"] != "error":
                    res["status"] = b.outcome
                runner.save()

    return plan
