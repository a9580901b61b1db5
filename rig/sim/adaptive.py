"""SGLang's adaptive speculative decoding: per batch-size slot, an EMA of accepted drafts picks the draft steps.

Modelled on SGLang 0.5.23's srt/speculative/adaptive_spec_params.py (DEFAULT_ADAPTIVE_CONFIG: lines 28-53,
_load_adaptive_config: 103-140, AdaptiveStepSlot: 153-272, AdaptiveSpeculativeParams._route: 342-358) and
adaptive_runtime_state.py (AdaptiveController); 0.5.17's file is the same but for slot "1"'s [1, 3, 7] (lines 22-47).
rig/sim/scheduler.py drives it once per decode batch, as eagle_worker_v2.py does: the routed slot's steps are
activated before the draft (activate_step_by_batch, line 1445), and the verify's accepted drafts per request are fed
back after it (on_verify_complete_cpu, line 1763).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("rig.sim")

# The default table, keyed by batch-size slot (adaptive_spec_params.py DEFAULT_ADAPTIVE_CONFIG). Slot "1" is
# [1, 3, 5, 7] from 0.5.23 on, [1, 3, 7] in 0.5.16/0.5.17 (read from the wheels: shared/reference/
# sglang-speculation-capacity.md section 3); the other slots are the same in both.
_SLOTS_AFTER_1 = {
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}
DEFAULT_CONFIGS: dict[str, dict[str, Any]] = {
    "0.5.23": {
        "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
        **_SLOTS_AFTER_1,
    },
    "0.5.17": {
        "1": {"candidate_steps": [1, 3, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
        **_SLOTS_AFTER_1,
    },
}


def cuda_graph_bs(max_bs: int) -> list[int]:
    """The decode batch sizes SGLang captures under speculation (arg_groups/cuda_graph_hook.py: 1..8, then steps of
    2 to 32, then of 4 to 64), capped at the largest batch that can run (the real log
    tests/data/h200-2026-12-02/eagle_adaptive_server.log captures up to 48 with max_running_requests 48)."""
    sizes = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
    return [b for b in sizes if b <= max_bs] or [1]


class AdaptiveConfigError(ValueError):
    """The adaptive config file cannot be used (SGLang raises at launch the same way)."""


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size slot's parameters ({**file, **entry}: a top-level key applies to every slot)."""

    candidate_steps: tuple[int, ...]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0.0


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise AdaptiveConfigError(f"cannot read --speculative-adaptive-config {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise AdaptiveConfigError(f"--speculative-adaptive-config {path} is not JSON: {e}") from None


def load_config(path: str | None, version: str = "0.5.23") -> dict[int, SlotConfig]:
    """The slots of a config file, or of the version's default table (0.5.23 adaptive_spec_params.py:103-140
    _load_adaptive_config, with SGLang's error wording; a top-level key that is not a batch size, like a later
    release's "strategy", is ignored as 0.5.23 ignores it). SGLang itself crashes on a file that is not an object."""
    cfg = DEFAULT_CONFIGS[version] if path is None else _read_json(path)
    if not isinstance(cfg, dict):
        raise AdaptiveConfigError(f"speculative adaptive config must be a JSON object, got {type(cfg).__name__}")
    slots: dict[int, SlotConfig] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or not all(type(s) is int and s >= 0 for s in steps):
            raise AdaptiveConfigError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        slots[int(key)] = _slot_config({**cfg, **entry}, key)
    if not slots:
        raise AdaptiveConfigError(
            "speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg.keys())}'
        )
    return slots


def _slot_config(merged: dict[str, Any], key: str) -> SlotConfig:
    fields = ("ema_alpha", "update_interval", "warmup_batches", "down_hysteresis", "up_hysteresis", "ceiling_coeff")
    values = {f: merged[f] for f in fields if f in merged}
    for f, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise AdaptiveConfigError(f"BS {key}: {f} must be a number, got {v!r}")
    for f in ("update_interval",):
        if f in values and values[f] < 1:
            raise AdaptiveConfigError(f"BS {key}: {f} must be >= 1, got {values[f]!r}")  # SGLang divides by it
    return SlotConfig(candidate_steps=tuple(sorted(set(merged["candidate_steps"]))), **values)


def candidate_union(slots: dict[int, SlotConfig]) -> list[int]:
    """Every slot's candidates together: the tiers whose runtime state is built at startup."""
    return sorted({s for c in slots.values() for s in c.candidate_steps})


class Slot:
    """AdaptiveStepSlot: an EMA of accepted drafts per request; every update_interval batches after the warm-up,
    step up while the EMA exceeds step - 0.5 + up_hysteresis, down while it is at most prev - 0.5 +
    down_hysteresis (0.5 when the next step down is 0); after a steps-0 interval, probe the next step up."""

    def __init__(self, initial_steps: int, cfg: SlotConfig):
        self.cfg = cfg
        self.candidates = list(cfg.candidate_steps)
        mid = self.candidates[len(self.candidates) // 2]
        self.current_steps = initial_steps if initial_steps in self.candidates else mid
        self.ema = float(self.current_steps - 1)  # a neutral start (-1 at steps 0: no history)
        self.batches = 0

    def update(self, accepted: list[int]) -> bool:
        """Feed one verify's accepted drafts per request; True when the steps changed."""
        if not accepted:
            return False
        c = self.cfg
        if self.current_steps > 0:  # steps 0 drafts nothing: the EMA is frozen
            self.ema = (1 - c.ema_alpha) * self.ema + c.ema_alpha * (sum(accepted) / len(accepted))
        self.batches += 1
        if self.batches <= c.warmup_batches or (self.batches - c.warmup_batches) % c.update_interval:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        old = self.current_steps
        idx = self.candidates.index(old)
        if old == 0:  # probe the smallest positive step after a nospec interval
            idx = min(idx + 1, len(self.candidates) - 1)
            target = self.candidates[idx]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)
            return self._apply(old, target)
        start = idx
        while idx > 0:
            prev = self.candidates[idx - 1]
            drop = (0.5 if prev == 0 else prev - 0.5) + self.cfg.down_hysteresis
            if self.ema > drop:
                break
            idx -= 1
        if idx == start:
            while idx < len(self.candidates) - 1 and self.ema > self.candidates[idx] - 0.5 + self.cfg.up_hysteresis:
                idx += 1
        target = self.candidates[idx]
        if self.cfg.ceiling_coeff > 0:  # the EMA ceiling only caps downward moves
            ceiling = max(1, math.ceil(self.ema * self.cfg.ceiling_coeff))
            if ceiling < target <= old:
                while idx > 0 and self.candidates[idx] > ceiling:
                    idx -= 1
                target = self.candidates[idx]
        return self._apply(old, target)

    def _apply(self, old: int, target: int) -> bool:
        if target == old:
            return False
        self.current_steps = target
        log.info("Adaptive spec params updated: steps %d -> %d (ema_accept_len=%.2f)", old, target, self.ema)
        return True


class AdaptiveController:
    """AdaptiveSpeculativeParams + AdaptiveController: routes a batch to its slot and holds the active tier."""

    def __init__(self, initial_steps: int, slots: dict[int, SlotConfig], graph_bs: list[int]):
        self.slots = {bs: Slot(initial_steps, c) for bs, c in sorted(slots.items())}
        self.keys = sorted(self.slots)
        self.graph_bs = sorted(graph_bs)
        self.candidate_steps = candidate_union(slots)
        self.active = initial_steps  # the worker's speculative_num_steps: what the gauges and internal_states show
        self.switches = 0

    def slot_key(self, batch_size: int) -> int:
        """Pad to the next captured graph size, then the largest slot key not above it (the smallest key if none)."""
        i = bisect.bisect_left(self.graph_bs, batch_size)
        padded = self.graph_bs[i] if i < len(self.graph_bs) else batch_size
        return self.keys[max(0, bisect.bisect_right(self.keys, padded) - 1)]

    def steps_for_batch(self, batch_size: int) -> int:
        """activate_step_by_batch: the routed slot's steps become the active tier for this decode."""
        self._activate(self.slots[self.slot_key(batch_size)].current_steps)
        return self.active

    def on_verify_complete(self, accepted: list[int], batch_size: int) -> None:
        slot = self.slots[self.slot_key(batch_size)]
        if slot.update(accepted):
            self._activate(slot.current_steps)

    def _activate(self, steps: int) -> None:
        if steps != self.active:  # eagle_worker_v2.py:1861-1872 apply_runtime_state
            log.info(
                "Switch adaptive runtime state: steps %d -> %d, draft_tokens %d -> %d",
                self.active,
                steps,
                self.active + 1,
                steps + 1,
            )
            self.active = steps
            self.switches += 1

    def startup_line(self) -> str:
        first = self.slots[self.keys[0]]
        return f"AdaptiveSpeculativeParams initialized: steps={first.current_steps}, candidate_steps={first.candidates}"


@dataclass(frozen=True)
class AdaptiveSpec:
    """What a scheduler needs to run the controller: the slots and the captured graph sizes."""

    slots: dict[int, SlotConfig]
    graph_bs: tuple[int, ...]

    @property
    def max_steps(self) -> int:
        return max(candidate_union(self.slots))

    def controller(self, initial_steps: int) -> AdaptiveController:
        return AdaptiveController(initial_steps, self.slots, list(self.graph_bs))


# Rows of the logits buffer per batch slot hold one vocabulary each; 0.5.17 sized the shared buffer for the startup
# draft count, so building a wider tier's target graph failed (model_executor/graph_shared_output.py
# get_logits_buffer; the real failure: tests/data/h200-2026-12-02/eagle_adaptive_server.log).
VOCAB_SIZE = 248320  # assumption: Qwen3.5's config.json vocab_size


def build_runtime_states(spec: AdaptiveSpec, startup_steps: int, version: str) -> tuple[list[str], str | None]:
    """AdaptiveController.init_states: one runtime state per candidate tier (the startup one exists already).
    Returns the log lines and, on 0.5.17 when a tier is wider than the startup one, the startup failure."""
    lines: list[str] = []
    max_bs = max(spec.graph_bs)
    for steps in candidate_union(spec.slots):
        if steps == startup_steps:
            continue
        if version == "0.5.17" and steps > startup_steps:
            have, need = max_bs * (startup_steps + 1), max_bs * (steps + 1)
            return lines, (
                f"AssertionError: shared logits buffer holds {have} rows but caller needs {need} "
                f"(vocab_size={VOCAB_SIZE})"
            )
        lines.append(f"Built adaptive runtime state steps={steps}: elapsed=0.00s, mem=0.00GB")
    return lines, None
