"""Held-out error of a fitted profile: fit without some measured points, predict them, for every point in turn.

The in-sample error of ``rig sim fit`` says how well the model can be bent to the figures; this says how well it
predicts a point it was not shown (cross-validation: leave-one-point-out by default, or K interleaved folds for a
large sweep, where one fit per point would take hours), which is what a twin is for.
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
    folds: int | None = None,
    first_step: float | None = None,
) -> list[HeldOut]:
    """For each fold of points: fit on the others (from ``base``), then predict that fold's figures.

    ``folds`` None: one point per fold (leave-one-point-out); K: the sorted points dealt into K folds (point i in
    fold i mod K), so that each fold spans the sweep rather than cutting off one end of it.
    """
    points = sorted({point_of(t) for t in targets})
    if len(points) < 2:
        raise ValueError("holding a point out needs at least two measured points")
    k = len(points) if folds is None else folds
    if not 2 <= k <= len(points):
        raise ValueError(f"--folds must be from 2 to the number of measured points ({len(points)}), got {k}")
    groups = [set(points[i::k]) for i in range(k)]
    out: list[HeldOut] = []
    for i, held in enumerate(groups, 1):
        if progress:
            progress(next(iter(held)) if len(held) == 1 else f"{len(held)} points", i, k)
        train = [t for t in targets if point_of(t) not in held and t.metric != "ratio"]
        test = [t for t in targets if point_of(t) in held and t.metric != "ratio"]
        prof = fit(train, base, free=free, max_evals=max_evals, first_step=first_step).profile
        for t, row in zip(test, evaluate(prof, test), strict=True):
            out.append(HeldOut(point_of(t), row["label"], row["metric"], row["target"], row["sim"]))
    return out
