"""Held-out error of a fitted profile: fit without one measured point, predict it, for every point in turn.

The in-sample error of ``rig sim fit`` says how well the model can be bent to the figures; this says how well it
predicts a point it was not shown (leave-one-point-out cross-validation), which is what a twin is for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rig.sim.fit import Target, evaluate, fit
from rig.sim.profile import Profile


@dataclass(frozen=True)
class HeldOut:
    point: str  # the held-out point: steps, concurrency, temperature
    label: str
    metric: str
    measured: float
    predicted: float

    @property
    def rel_err(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured else float("nan")


def point_of(t: Target) -> str:
    """The point a target measures (every figure of one point is held out together)."""
    sc = t.scenario
    return f"steps{t.steps}" if sc is None else f"steps{sc.steps} C={sc.concurrency} T={sc.temperature:g}"


def hold_out_each_point(
    targets: list[Target],
    base: Profile,
    free: tuple[str, ...],
    max_evals: int,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[HeldOut]:
    """For each point: fit on the others (from ``base``), then predict that point's figures."""
    points = sorted({point_of(t) for t in targets})
    if len(points) < 2:
        raise ValueError("holding a point out needs at least two measured points")
    out: list[HeldOut] = []
    for i, p in enumerate(points, 1):
        if progress:
            progress(p, i, len(points))
        train = [t for t in targets if point_of(t) != p and t.metric != "ratio"]
        test = [t for t in targets if point_of(t) == p and t.metric != "ratio"]
        prof = fit(train, base, free=free, max_evals=max_evals).profile
        for row in evaluate(prof, test):
            out.append(HeldOut(p, row["label"], row["metric"], row["target"], row["sim"]))
    return out
