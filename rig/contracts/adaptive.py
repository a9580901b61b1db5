"""SGLang's adaptive speculation table (``--speculative-adaptive``): batch-size slots and their candidate steps, as
SGLang reads them, and the typed record a server configuration's manifest entry carries.

Rules from SGLang's python/sglang/srt/speculative/adaptive_spec_params.py (``_load_adaptive_config``,
``DEFAULT_ADAPTIVE_CONFIG``) and adaptive_step_router.py (``batch_size_key_for_batch``):

- the config file is a JSON object; its keys that are all digits are batch-size slots, other keys (``strategy``,
  ``ema_alpha``, ``update_interval``, ``warmup_batches``, hysteresis) are shared settings merged into every slot;
- each slot's ``candidate_steps`` is a non-empty list of non-negative ints; at least one slot must exist;
- the launch's ``--speculative-num-steps`` must be one of the union of every slot's candidates
  (arg_groups/speculative_hook.py);
- a running batch is padded up to a captured CUDA-graph size, then routed to the largest slot key not above it
  (the smallest slot below every key).

The default table: slot "1" [1,3,5,7] in 0.5.23 ([1,3,7] in 0.5.16 and 0.5.17), "8" [0,1,3], "32" [0,1], "64" [0]
(shared/reference/sglang-speculation-capacity.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

Slots = dict[str, list[int]]  # slot key (a batch size, as digits) -> candidate steps, sorted

DEFAULT_SLOTS_0_5_23: Slots = {"1": [1, 3, 5, 7], "8": [0, 1, 3], "32": [0, 1], "64": [0]}
DEFAULT_SLOTS_0_5_17: Slots = {"1": [1, 3, 7], "8": [0, 1, 3], "32": [0, 1], "64": [0]}
OLD_TABLE_VERSIONS = ("0.5.16", "0.5.17")


class AdaptiveTableError(ValueError):
    """An adaptive config SGLang would refuse (one line, in SGLang's terms)."""


class AdaptiveTable(BaseModel):
    """What an adaptive server switches between: its slots' candidate steps, the steps it starts at, and where the
    table came from (the default table of a version, or a config file)."""

    model_config = ConfigDict(extra="forbid")

    engine: str = "sglang"
    slots: Slots  # empty: the table is not known here (a config file the driver cannot read)
    startup_steps: int | None = None
    source: str  # e.g. "SGLang 0.5.23 default table", "config file /path/x.json"
    config_file: str | None = None
    note: str | None = None  # what is assumed or unknown

    @property
    def candidate_union(self) -> list[int]:
        return sorted({s for steps in self.slots.values() for s in steps})

    def describe(self) -> str:
        """'1:[1,3,5,7] 8:[0,1,3] 32:[0,1] 64:[0]' (slots in batch-size order)."""
        if not self.slots:
            return "table unknown"
        return " ".join(f"{k}:[{','.join(map(str, v))}]" for k, v in sorted(self.slots.items(), key=_slot_order))


def _slot_order(item: tuple[str, list[int]]) -> int:
    return int(item[0])


def slots_of(cfg: Any) -> Slots:
    """The slots of an adaptive config object, validated as SGLang's ``_load_adaptive_config`` does."""
    if not isinstance(cfg, dict):
        raise AdaptiveTableError(f"speculative adaptive config must be a JSON object, got {type(cfg).__name__}")
    out: Slots = {}
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue  # a shared setting, merged into every slot
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        ):
            raise AdaptiveTableError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        out[str(key)] = sorted(set(steps))
    if not out:
        raise AdaptiveTableError(
            "speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg)}'
        )
    return out


def read_config_file(path: str | Path) -> Slots:
    """The slots of an adaptive config file (AdaptiveTableError, one line, when SGLang would refuse it)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise AdaptiveTableError(f"cannot read the adaptive config {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise AdaptiveTableError(f"the adaptive config {path} is not JSON ({e.msg} at line {e.lineno})") from None
    try:
        return slots_of(data)
    except AdaptiveTableError as e:
        raise AdaptiveTableError(f"{path}: {e}") from None


def default_slots(version: str | None) -> tuple[Slots, str, str | None]:
    """The default table of an SGLang version, its source text, and a note when the version is not known."""
    if version and version.startswith(OLD_TABLE_VERSIONS):
        return DEFAULT_SLOTS_0_5_17, f"SGLang {version} default table", None
    if version:
        return DEFAULT_SLOTS_0_5_23, f"SGLang {version} default table (0.5.23's)", None
    return DEFAULT_SLOTS_0_5_23, "SGLang default table", "server version unknown: 0.5.23's default table assumed"


def steps_refusal(steps: int, slots: Slots) -> str | None:
    """Why SGLang refuses to launch with these startup steps (not among the candidates), else None."""
    union = sorted({s for v in slots.values() for s in v})
    if steps in union:
        return None
    return f"--speculative-num-steps {steps} is not among the adaptive candidate steps {union}"


def slot_for_batch(batch: int, slots: Slots, graph_sizes: list[int] | None = None) -> str:
    """The slot a running batch routes to: padded up to a captured CUDA-graph size, then the largest key not above
    it (the smallest key when it is below all)."""
    if graph_sizes:
        bigger = [g for g in sorted(graph_sizes) if g >= batch]
        if bigger:
            batch = bigger[0]
    keys = sorted(int(k) for k in slots)
    below = [k for k in keys if k <= batch]
    return str(below[-1] if below else keys[0])
