"""Bracketing and bisection of a load variable (concurrency or rate) against an SLO verdict.

The search assumes what every SLO search assumes (vLLM's ``serve_sla``, SageMaker's max-concurrency search): a
point that meets the SLOs at load x also meets them at every load below x. It probes the start value, doubles until a
probe fails (or the maximum is reached), halves until one passes (or the minimum is reached), then bisects between
the largest passing and the smallest failing value until the two are adjacent (concurrency) or within the relative
tolerance (rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class Domain:
    """The values a search may probe."""

    lo: float
    hi: float

    def up(self, v: float) -> float | None:
        raise NotImplementedError

    def down(self, v: float) -> float | None:
        raise NotImplementedError

    def mid(self, passing: float, failing: float) -> float | None:
        raise NotImplementedError


MAX_CONCURRENCY = 1024  # the largest value a search probes unless told (--search-max)
MAX_RATE = 1000.0  # requests/s


@dataclass(frozen=True)
class IntDomain(Domain):
    """Concurrency: integers in [lo, hi]."""

    lo: int = 1
    hi: int = MAX_CONCURRENCY

    def up(self, v: float) -> int | None:
        return min(int(v) * 2, self.hi) if v < self.hi else None

    def down(self, v: float) -> int | None:
        return max(int(v) // 2, self.lo) if v > self.lo else None

    def mid(self, passing: float, failing: float) -> int | None:
        return (int(passing) + int(failing)) // 2 if failing - passing > 1 else None


def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


@dataclass(frozen=True)
class RateDomain(Domain):
    """Arrival rate (requests/s) in [lo, hi], bisected geometrically to a relative tolerance; values rounded to three
    significant digits so point ids stay readable."""

    lo: float = 0.05
    hi: float = MAX_RATE
    tolerance: float = 0.1

    def up(self, v: float) -> float | None:
        return min(_sig3(v * 2), self.hi) if v < self.hi else None

    def down(self, v: float) -> float | None:
        return max(_sig3(v / 2), self.lo) if v > self.lo else None

    def mid(self, passing: float, failing: float) -> float | None:
        if failing / passing <= 1 + self.tolerance:
            return None
        m = _sig3(math.sqrt(passing * failing))
        return m if passing < m < failing else None


@dataclass(frozen=True)
class LadderDomain(Domain):
    """A fixed, sorted set of levels (a grid's levels): bisection over their indices."""

    values: tuple[float, ...]

    @property
    def lo(self) -> float:  # type: ignore[override]
        return self.values[0]

    @property
    def hi(self) -> float:  # type: ignore[override]
        return self.values[-1]

    def _i(self, v: float) -> int:
        return self.values.index(v)

    def up(self, v: float) -> float | None:
        i = self._i(v)
        return self.values[i + 1] if i + 1 < len(self.values) else None

    def down(self, v: float) -> float | None:
        i = self._i(v)
        return self.values[i - 1] if i > 0 else None

    def mid(self, passing: float, failing: float) -> float | None:
        a, b = self._i(passing), self._i(failing)
        return self.values[(a + b) // 2] if b - a > 1 else None


@dataclass
class Bisection:
    """The state of one search: what passed, what failed, which value to probe next."""

    domain: Domain
    start: float
    max_passing: float | None = None
    min_failing: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def next(self) -> float | None:
        """The next value to probe, or None when the boundary is found (or cannot be)."""
        if self.max_passing is None:
            return self.start if self.min_failing is None else self.domain.down(self.min_failing)
        if self.min_failing is None:
            return self.domain.up(self.max_passing)
        return self.domain.mid(self.max_passing, self.min_failing)

    def record(self, value: float, meets: bool) -> None:
        self.probes.append((value, meets))
        if meets:
            if self.max_passing is None or value > self.max_passing:
                self.max_passing = value
        elif self.min_failing is None or value < self.min_failing:
            self.min_failing = value

    @property
    def outcome(self) -> str:
        """bracketed | capped (passes at the maximum) | none_pass (fails at the minimum) | searching."""
        if self.next() is not None:
            return "searching"
        if self.min_failing is None:
            return "capped"
        if self.max_passing is None:
            return "none_pass"
        return "bracketed"


def ladder(values: Sequence[float]) -> LadderDomain:
    return LadderDomain(tuple(sorted(set(values))))
