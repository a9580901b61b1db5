"""What a server really ran with: the effective configuration read back from the server, against what was asked.

SGLang resolves its arguments before it serves (arg_groups/speculative_hook.py): NEXTN becomes EAGLE, topk 1 forces
num_draft_tokens = steps + 1, max running requests becomes 48 under speculation or is capped by memory. Its
/server_info returns the resolved arguments and internal_states[] with the scheduler's effective values
(entrypoints/http_server.py). Per-request sampling seeds count only with --enable-deterministic-inference
(sampling/sampling_batch_info.py). rig labels points with what ran and says where that differs from the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from rig.contracts.server import EffectiveConfig, KnobChange, Knobs, KnobValue, StartupFacts
from rig.server import spec_schedule as sched
from rig.server.spec import ServerConfig

V = TypeVar("V")  # a knob value of the configuration (a list for extra_args)

ALIASES = {"NEXTN": "EAGLE"}  # spec_registry.py: NEXTN is a reserved alias of EAGLE, not a change


def _canonical(value: KnobValue) -> KnobValue:
    """A knob's value with a reserved alias read as what it stands for."""
    return ALIASES.get(value, value) if isinstance(value, str) else value


def _flag_value(argv: tuple[str, ...], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def requested(cfg: ServerConfig) -> Knobs:
    """The values the user asked for, under the knob names points are labelled with."""
    out: Knobs = {"steps": cfg.steps}
    if cfg.steps > 0 and cfg.engine in ("sglang", "sim"):
        ngram = cfg.spec_algorithm.upper() == "NGRAM"  # labelled by draft tokens (rig.server.engines)
        out.update(
            spec_algorithm=cfg.spec_algorithm,
            eagle_topk=cfg.eagle_topk,
            num_draft_tokens=cfg.num_draft_tokens or (cfg.steps if ngram else cfg.steps + 1),
        )
    if cfg.scheduled and cfg.spec_schedule is not None:
        out["spec_schedule"] = sched.label(cfg.spec_schedule)  # K by batch size; steps is its ceiling
    mrr = _flag_value(cfg.extra_args, "--max-running-requests")
    if mrr is not None and mrr.isdigit():
        out["max_running_requests"] = int(mrr)
    out["deterministic_inference"] = cfg.deterministic or "--enable-deterministic-inference" in cfg.extra_args
    return out


def _sglang_effective(info: dict[str, Any], startup: StartupFacts) -> Knobs:
    algo = info.get("speculative_algorithm")
    out: Knobs = {"steps": int(info.get("speculative_num_steps") or 0) if algo else 0}
    if algo:
        out.update(
            spec_algorithm=str(algo).upper(),
            eagle_topk=info.get("speculative_eagle_topk"),
            num_draft_tokens=info.get("speculative_num_draft_tokens"),
        )
    if algo and str(algo).upper() == "NGRAM":
        # NGRAM's label is its draft tokens, its width the BFS breadth (_handle_ngram copies it over eagle_topk)
        out["steps"] = int(info.get("speculative_num_draft_tokens") or 0)
        out["eagle_topk"] = info.get("speculative_ngram_max_bfs_breadth", out["eagle_topk"])
    states = info.get("internal_states")
    state0 = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    mrr = (
        state0.get("effective_max_running_requests_per_dp")
        or startup.get("max_running_requests")
        or info.get("max_running_requests")
    )
    if isinstance(mrr, int):
        out["max_running_requests"] = mrr
    det = info.get("enable_deterministic_inference")
    out["deterministic_inference"] = bool(det) if det is not None else None
    # What the engine runs with, beyond the knobs: --enable-deterministic-inference changes these
    # (arg_groups/attention_hook.py::handle_deterministic_inference, overrides.py::_deterministic_*).
    if isinstance(info.get("disable_radix_cache"), bool):
        out["radix_cache"] = not info["disable_radix_cache"]
    for key in ("attention_backend", "sampling_backend"):
        if isinstance(info.get(key), str):
            out[key] = info[key]
    if isinstance(info.get("disable_custom_all_reduce"), bool):
        out["custom_all_reduce"] = not info["disable_custom_all_reduce"]
    return out


def _vllm_effective(want: Knobs, startup: StartupFacts) -> Knobs:
    """What vLLM's startup log says it runs: num_spec_tokens from its engine config line (SpeculativeConfig.__repr__,
    config/speculative.py:2004), and the schedule kept unless vLLM said it dropped it (config/vllm.py:1058-1075)."""
    out: Knobs = {}
    if "num_spec_tokens" in startup:
        out["steps"] = startup["num_spec_tokens"]
    if "spec_schedule" in want and "init_engine_s" in startup:  # the log was read through the engine's start
        out["spec_schedule"] = "off" if startup.get("spec_schedule_disabled") else want["spec_schedule"]
    return out


def effective_config(
    cfg: ServerConfig, server_info: Any, startup: StartupFacts | None, speaks_sglang: bool = False
) -> EffectiveConfig:
    """What was requested, what ran (``effective``), the knobs whose value changed, and ``seeds_honoured``.

    ``speaks_sglang``: a server rig did not launch was identified as SGLang (or said to be), so its /server_info is
    read like a launched one's: a --steps label the server does not run is a change, said as a warning.
    seeds_honoured: SGLang (and the sim) only with deterministic inference; vLLM always (a per-request seed gets its
    own generator); another external server: unknown (None)."""
    want = requested(cfg)
    if (
        (cfg.engine in ("sglang", "sim") or speaks_sglang)
        and isinstance(server_info, dict)
        and "http_status" not in server_info
        and "error" not in server_info
    ):
        got = _sglang_effective(server_info, startup or StartupFacts())
        det = got.get("deterministic_inference")
        seeds = det if isinstance(det, bool) else None
    elif cfg.engine == "vllm":
        got, seeds = _vllm_effective(want, startup or StartupFacts()), True
    else:
        got, seeds = {}, None
    changed: list[KnobChange] = []
    for knob, asked in want.items():
        if knob not in got or got[knob] is None:
            continue
        eff = got[knob]
        same = _canonical(asked) == _canonical(eff)
        if knob == "deterministic_inference" and not asked:
            same = True  # nothing was asked for
        if knob == "max_running_requests" and "max_running_requests" not in want:
            same = True
        if not same:
            changed.append(KnobChange(knob=knob, requested=asked, effective=eff))
    return EffectiveConfig(requested=want, effective=got, changed=changed, seeds_honoured=seeds)


def change_lines(config_id: str, eff: EffectiveConfig | None) -> list[str]:
    """One warning line per requested value the server changed, and one for what deterministic inference cost."""
    if eff is None:
        return []
    out = [
        f"server {config_id}: requested {c.knob}={c.requested} but the server runs {c.effective}" for c in eff.changed
    ]
    line = deterministic_line(config_id, eff)
    return out + [line] if line else out


def deterministic_line(config_id: str, eff: EffectiveConfig) -> str | None:
    """What --enable-deterministic-inference changed in the engine, read back from /server_info: it is not a seed
    switch (SGLang arg_groups/attention_hook.py::handle_deterministic_inference, overrides.py)."""
    got = eff.effective
    if not got.get("deterministic_inference") or "radix_cache" not in got:
        return None
    parts = []
    if got.get("radix_cache") is False:
        parts.append(
            f"radix (prefix) cache OFF (attention backend {got.get('attention_backend')}: SGLang keeps the "
            "cache under deterministic inference only on fa3/fa4/triton), so multi-turn prefixes are "
            "prefilled again"
        )
    else:
        parts.append(f"radix cache on (attention backend {got.get('attention_backend')})")
    if got.get("sampling_backend"):
        parts.append(f"sampling backend {got['sampling_backend']}")
    if got.get("custom_all_reduce") is False:
        parts.append("custom all-reduce off (NCCL tree)")
    return (
        f"server {config_id}: deterministic inference changes the engine, not only the seeds: "
        + "; ".join(parts)
        + " -- its throughput and latency are not those of the default engine"
    )


def label_knobs(knobs: Mapping[str, V], eff: EffectiveConfig | None) -> dict[str, V | KnobValue]:
    """The point's knobs with the values the server actually ran (for labels and grouping)."""
    out: dict[str, V | KnobValue] = dict(knobs)
    for c in eff.changed if eff is not None else []:
        if c.knob in out:
            out[c.knob] = c.effective
    return out
