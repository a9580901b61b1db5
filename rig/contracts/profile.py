"""A load profile: the phases of one point (closed loop: concurrency steps; open loop: rate steps and ramps).

The same typed phases are the spec (``load.profile``) and the point's schedule in the manifest (``phases``).
Text form, as the CLI takes it: ``1:60s,64:60s,1:60s`` (closed loop: concurrency:duration) and
``2:30s,ramp(2,16,60s),16:30s`` (open loop: rate:duration, ``ramp(start,end,duration)`` a linear ramp).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rig.contracts.errors import ContractError

ProfileKind = Literal["concurrency", "rate"]
MAX_PHASES = 100
# one step: level:duration (duration with an optional s, m or h); one ramp: ramp(start,end,duration)
_STEP = re.compile(r"^\s*([0-9.eE+-]+)\s*:\s*([0-9.eE+-]+)\s*([smh]?)\s*$")
_RAMP = re.compile(r"^\s*ramp\(\s*([0-9.eE+-]+)\s*,\s*([0-9.eE+-]+)\s*,\s*([0-9.eE+-]+)\s*([smh]?)\s*\)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


class LoadPhase(BaseModel):
    """One phase: its concurrency (closed loop) or its rate, constant or ramped to ``rate_end`` (open loop)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    duration_s: float = Field(gt=0, description="Seconds the phase lasts.")
    concurrency: int | None = Field(None, ge=0, le=1_000_000, description="Closed loop: in-flight requests.")
    rate: float | None = Field(None, ge=0, le=1e9, description="Open loop: requests/s (at the phase's start).")
    rate_end: float | None = Field(None, ge=0, le=1e9, description="Open loop: requests/s at its end (a ramp).")
    start_s: float | None = Field(None, ge=0, description="Offset from the point's start (set by the schedule).")

    @model_validator(mode="after")
    def _one_kind(self) -> LoadPhase:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a phase gives either concurrency (closed loop) or rate (open loop)")
        if self.rate_end is not None and self.rate is None:
            raise ValueError("rate_end ramps a rate: give rate too")
        return self

    @property
    def kind(self) -> ProfileKind:
        return "concurrency" if self.concurrency is not None else "rate"

    def label(self) -> str:
        """The phase as the text form writes it."""
        if self.concurrency is not None:
            return f"{self.concurrency}:{self.duration_s:g}s"
        if self.rate_end is not None:
            return f"ramp({self.rate:g},{self.rate_end:g},{self.duration_s:g}s)"
        return f"{self.rate:g}:{self.duration_s:g}s"


def _number(text: str, what: str, whole: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ContractError(f"load profile {whole!r}: {what} {text!r} is not a number") from None


def parse_profile(text: str, kind: ProfileKind) -> list[LoadPhase]:
    """``1:60s,64:60s`` (kind concurrency) or ``2:30s,ramp(2,16,60s)`` (kind rate) as phases; ContractError (one
    line) for anything else."""
    parts = [p for p in re.split(r",(?![^(]*\))", text.strip()) if p.strip()]
    if not parts:
        raise ContractError("load profile is empty; give phases such as 1:60s,64:60s")
    phases: list[dict[str, float | int]] = []
    for part in parts:
        ramp, step = _RAMP.match(part), _STEP.match(part)
        if ramp and kind == "rate":
            start, end = _number(ramp[1], "rate", text), _number(ramp[2], "rate", text)
            seconds = _number(ramp[3], "duration", text) * _UNIT[ramp[4]]
            phases.append({"rate": start, "rate_end": end, "duration_s": seconds})
        elif step:
            level = _number(step[1], kind, text)
            if kind == "concurrency" and level != int(level):
                raise ContractError(f"load profile {text!r}: concurrency {step[1]} is not a whole number")
            value: float | int = int(level) if kind == "concurrency" else level
            phases.append({kind: value, "duration_s": _number(step[2], "duration", text) * _UNIT[step[3]]})
        else:
            form = "RATE:SECONDSs or ramp(START,END,SECONDSs)" if kind == "rate" else "CONCURRENCY:SECONDSs"
            raise ContractError(f"load profile {text!r}: cannot read {part.strip()!r} (each phase is {form})")
    try:
        return check_profile([LoadPhase.model_validate(p) for p in phases])
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise ContractError(f"load profile {text!r}: {_first_error(e)}") from None


def _first_error(e: ValueError) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):
        first = errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"{loc}: {first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})"
    return str(e)


def check_profile(phases: Sequence[LoadPhase]) -> list[LoadPhase]:
    """One kind throughout, at most MAX_PHASES, some load somewhere; returns the phases (ValueError otherwise)."""
    if not phases:
        raise ValueError("a load profile needs at least one phase")
    if len(phases) > MAX_PHASES:
        raise ValueError(f"a load profile of at most {MAX_PHASES} phases (got {len(phases)})")
    if len({p.kind for p in phases}) > 1:
        raise ValueError("a load profile is all concurrency phases (closed loop) or all rate phases (open loop)")
    if all(peak_of(p) == 0 for p in phases):
        raise ValueError("every phase of the load profile is idle (0); give one phase some load")
    return list(phases)


def peak_of(phase: LoadPhase) -> float:
    """The phase's highest concurrency or rate."""
    if phase.concurrency is not None:
        return float(phase.concurrency)
    return max(phase.rate or 0.0, phase.rate_end if phase.rate_end is not None else 0.0)


def schedule(phases: Sequence[LoadPhase]) -> list[LoadPhase]:
    """The phases with their start offsets filled in (the manifest's form)."""
    out, t = [], 0.0
    for p in phases:
        out.append(p.model_copy(update={"start_s": t}))
        t += p.duration_s
    return out


def total_s(phases: Sequence[LoadPhase]) -> float:
    """The profile's length: the point's duration."""
    return float(sum(p.duration_s for p in phases))


def profile_text(phases: Sequence[LoadPhase]) -> str:
    """The phases in the CLI's text form."""
    return ",".join(p.label() for p in phases)


def generator_share(level: int, n_gen: int, index: int) -> int:
    """Generator ``index``'s share of a concurrency over ``n_gen`` generators (the shares sum to ``level``)."""
    return level // n_gen + (index < level % n_gen)


def fit_profile(
    phases: Sequence[LoadPhase], mode: str, requests: int | None, duration_s: float | None, rates: Sequence[float]
) -> float:
    """The point's duration under a profile; ValueError (one line) when the rest of the load spec contradicts it."""
    check_profile(phases)
    want: ProfileKind | None = {"closed": "concurrency", "poisson": "rate", "gamma": "rate"}.get(mode)  # type: ignore[assignment]
    if want is None:
        raise ValueError(f"mode {mode} takes no load profile (a trace sets its own times)")
    if phases[0].kind != want:
        flag = "--load-profile (concurrency phases)" if want == "concurrency" else "--rate-profile (rate phases)"
        raise ValueError(f"mode {mode} takes {flag}, not {phases[0].kind} phases")
    if requests is not None:
        raise ValueError("a load profile is bound by its phases' durations; drop --requests")
    if rates:
        raise ValueError(f"a load profile sets the rates itself; drop the rates {list(rates)} (--rate)")
    total = total_s(phases)
    if duration_s is not None and abs(duration_s - total) > 1e-9:
        raise ValueError(f"the load profile lasts {total:g}s, its phases' sum; drop --duration {duration_s:g}")
    return total
