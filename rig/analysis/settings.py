"""How a run's server configurations are named in the tables: by the knob values that differ between them.

A grid sweep (``--grid eagle_topk=1,4``) gives configurations that share a steps value; the tables named them
``steps=4 (sim-s4-01a61f00)`` by configuration hash. The knobs whose values differ between the run's configurations
(steps aside, since every label shows it) name them instead: ``steps=4 (eagle_topk=4)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rig.analysis.runs import Run

SHOWN_APART = frozenset({"steps", "engine"})  # every label and table title already shows these


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def grid_knobs(run: Run) -> dict[str, str]:
    """Per server configuration, 'knob=value, ...' of the knobs whose values differ between the run's configurations
    (as each ran them); empty where nothing but steps differs."""
    knobs: dict[str, Mapping[str, Any]] = {}
    for p in run.points:
        if p.server_config and p.server_config not in knobs:
            knobs[p.server_config] = p.knobs
    for cid, cfg in run.manifest.server_configs.items():
        knobs.setdefault(cid, cfg.knobs)
    names = list(dict.fromkeys(k for ks in knobs.values() for k in ks if k not in SHOWN_APART))
    varying = [k for k in names if len({_value(ks.get(k)) for ks in knobs.values()}) > 1]
    return {cid: ", ".join(f"{k}={_value(ks.get(k))}" for k in varying) for cid, ks in knobs.items()}


def setting_name(steps: Any, config: Any, knob_label: str | None, shared: bool, adaptive: bool = False) -> str:
    """'steps=N' ('adaptive(start steps=N)' for a server that switches steps itself), and where another
    configuration shares N, what tells them apart: its knob values, else its id."""
    name = f"adaptive(start steps={steps})" if adaptive else f"steps={steps}"
    if shared:
        name += f" ({knob_label or config})"
    return name
