"""A point's validity: the thresholds it is judged by, and ``judge_point``, the one place the rules live."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rig.contracts.errors import ContractError
from rig.contracts.generator import GeneratorReport


class Thresholds(BaseModel):
    """The limits a point's validity is judged by; recorded in the manifest with every run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slip_p99_ms: float = Field(default=10.0, gt=0)  # open loop: a generator's p99 send slip above this
    loop_lag_p99_ms: float = Field(default=50.0, gt=0)  # a generator's event-loop lag p99 above this
    cpu_pct: float = Field(default=90.0, gt=0)  # a generator's CPU share at or above this
    rate_ratio: float = Field(default=0.99, gt=0)  # open loop: achieved / scheduled send rate below this
    min_window_s: float = Field(default=2.0, ge=0)  # lag or CPU over a shorter generator window is not evidence

    def with_overrides(self, text: str) -> Thresholds:
        """These thresholds with ``name=value[,name=value...]`` applied; ContractError on a bad one."""
        updates: dict[str, float] = {}
        for item in filter(None, (s.strip() for s in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in type(self).model_fields:
                raise ContractError(
                    f"--thresholds: {item!r} is not NAME=VALUE with NAME one of {', '.join(type(self).model_fields)}"
                )
            try:
                updates[name] = float(value)
            except ValueError:
                raise ContractError(f"--thresholds: {name} must be a number, not {value.strip()!r}") from None
        try:
            return type(self).model_validate({**self.model_dump(), **updates})
        except ValidationError as e:
            err = e.errors()[0]
            raise ContractError(f"--thresholds: {err['loc'][0]} {err['msg'].lower()}") from None


# Flags judge_point decides (the others a point carries come from its status and its records on disk).
JUDGED_FLAGS = frozenset(
    {"client_saturated", "schedule_slip", "rate_shortfall", "generator_lost", "server_died", "dataset_exhausted"}
)
# Flags that blame the measuring host, not the system under test (a busy client, a simulator its host stalled, a
# client that read two writes at once): the same point measured again on a quieter host may well be valid (or
# timed right). `rig sweep --resume DIR --redo-disturbed` does that.
DISTURBED_FLAGS = frozenset({"client_saturated", "schedule_slip", "rate_shortfall", "sim_behind", "itl_read_bound"})


def judge_point(
    load_mode: str | None, generators: Sequence[GeneratorReport], thresholds: Thresholds, server_died: str | None = None
) -> dict[str, str]:
    """The point's validity flags, each with the figure that tripped it: the one place these rules live.

    A generator saturated (CPU share or event-loop lag over a window long enough to mean something), an open loop
    that slipped behind its schedule or sent below its rate, a generator lost, the server dead, a level bound by a
    duration whose sessions ran out before it ended (a dataset smaller than rate x duration, or than a closed loop
    serves in it: its load fell away early, unlike the level asked for).
    """
    t = thresholds
    why: dict[str, str] = {}
    open_loop = load_mode not in (None, "closed")
    for g in generators:
        name = f"generator {g.generator}"
        if g.status == "failed" or "died" in (g.error or ""):
            why["generator_lost"] = f"{name}: {g.error}" if g.error else f"{name} failed"
        if g.ran_out_s is not None and "dataset_exhausted" not in why:
            why["dataset_exhausted"] = (
                f"{name}: the workload's sessions ran out {g.ran_out_s:.1f}s into a level bound by its duration, "
                f"so its load fell away early (a dataset smaller than the level; --workload-opt cycle=true repeats it)"
            )
        # A lag percentile or a CPU share over a blink of time (every request failing in milliseconds) means nothing.
        if g.window_s is None or g.window_s >= t.min_window_s:
            over = f" over {g.window_s:.0f}s" if g.window_s is not None else ""
            if (g.cpu_pct or 0) >= t.cpu_pct:
                why["client_saturated"] = f"{name} used {g.cpu_pct:.0f}% CPU (limit {t.cpu_pct:.0f}%){over}"
            elif (g.loop_lag_p99_ms or 0) > t.loop_lag_p99_ms:
                why["client_saturated"] = (
                    f"{name} event-loop lag p99 {g.loop_lag_p99_ms:.0f} ms (limit {t.loop_lag_p99_ms:.0f} ms)"
                )
        if not open_loop:
            continue
        slip_ms = 1e3 * (g.slip_p99_s or 0)
        if slip_ms > t.slip_p99_ms:
            why["schedule_slip"] = f"{name} send slip p99 {slip_ms:.1f} ms (limit {t.slip_p99_ms:g} ms)"
            why.setdefault("client_saturated", f"{name} fell behind its schedule (send slip p99 {slip_ms:.1f} ms)")
        if (g.rate_ratio or 1.0) < t.rate_ratio:
            why["rate_shortfall"] = f"{name} sent at {100 * (g.rate_ratio or 0):.0f}% of the scheduled rate"
            why.setdefault("client_saturated", f"{name} sent below its scheduled rate")
    if server_died is not None:
        why["server_died"] = server_died
    return dict(sorted(why.items()))


def thresholds_of_spec(spec: dict[str, Any] | None) -> Thresholds:
    """The thresholds a run with this recorded spec judged by (its load's slip and lag limits, the rest default)."""
    load = (spec or {}).get("load") or {}
    over: dict[str, float] = {}
    if isinstance(load.get("slip_threshold_s"), (int, float)):
        over["slip_p99_ms"] = 1e3 * load["slip_threshold_s"]
    if isinstance(load.get("loop_lag_threshold_s"), (int, float)):
        over["loop_lag_p99_ms"] = 1e3 * load["loop_lag_threshold_s"]
    return Thresholds(**over)
