"""The speculative schedule in the engines' own words: the report's bands (offered load: concurrency or rate) turned
into the server's running batch, then written as vLLM's ``num_speculative_tokens_per_batch_size`` and as an SGLang
adaptive config file, each with the command line that uses it.

**Offered load to running batch.** Each band opens at a measured level; its best setting's points there give the
running batch the server kept: the time-weighted mean of ``sglang:num_running_reqs`` (``vllm:num_requests_running``)
over the point's scrapes (each value held until the next; ramp-up and drain included), per data-parallel rank (the
engines schedule per rank).
A band's batch range starts at that batch, rounded (the first at 1), and runs to the next band's start - 1; the last
runs to the server's max running requests (or the largest batch seen). Bands whose batch is not above the one below
(a setting that queues instead of batching) are merged into it, said in the notes. Adjacent ranges with the same
steps are one range.

**vLLM** (vllm/config/speculative.py ``num_speculative_tokens_per_batch_size``: inclusive ``[start, end, K]``,
checked by vllm/v1/spec_decode/dynamic/utils.py ``validate_and_normalize_dynamic_sd_schedule``): starts and ends
positive, start <= end, K >= 0, ranges sorted and not overlapping, the first starting at 1; ``num_speculative_tokens``
must be > 0 and every K is clamped to it (``build_dynamic_sd_schedule_lookup``), so it is set to the largest K.

**SGLang** (srt/speculative/adaptive_spec_params.py, adaptive_step_router.py): one slot per range start with its
steps as the only candidate (so the controller holds the schedule's steps there); a batch is padded up to a captured
CUDA-graph size and routed to the largest slot key not above it, so a slot that starts between graph sizes takes
effect from the graph size below it + 1. ``--speculative-num-steps`` must be one of the candidates: batch 1's
steps (the smallest positive one when that is 0). Only EAGLE/EAGLE3 run adaptive (NEXTN is EAGLE).
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import numpy as np

from rig.analysis import compare as cmp
from rig.analysis.frontier import valid
from rig.analysis.rows import (
    BatchBand,
    EngineRangeRow,
    EngineSchedule,
    ScheduleGroup,
    SglangAdaptiveConfig,
    SglangSlot,
    VllmSpeculativeConfig,
)
from rig.analysis.runs import Run
from rig.analysis.server_series import Series, dp_ranks, effective_limits
from rig.contracts import CampaignRow
from rig.contracts.adaptive import AdaptiveTableError, slots_of

ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")  # adaptive_unsupported_reason: EAGLE/EAGLE3 only (NEXTN is EAGLE)


def time_weighted_mean(s: Series) -> float | None:
    """The mean of a gauge with each sample held until the next (the last closes the window)."""
    if s.empty:
        return None
    if s.ts.size == 1:
        return float(s.values[0])
    dt = np.diff(s.ts)
    span = float(dt.sum())
    return float(np.sum(s.values[:-1] * dt) / span) if span > 0 else float(np.mean(s.values))


def _running(run: Run, rows: list[CampaignRow], series: dict[str, dict[str, Series]]) -> float | None:
    """The mean running batch per DP rank of these points (None when none has the gauge)."""
    vals = []
    for r in rows:
        s = series.get(r.point, {}).get("running")
        m = time_weighted_mean(s) if s is not None else None
        if m is not None:
            vals.append(m / dp_ranks(run, run.point(r.point)))
    return float(np.mean(vals)) if vals else None


def _bands(
    run: Run, group: ScheduleGroup, campaign: list[CampaignRow], series: dict[str, dict[str, Series]], notes: list[str]
) -> list[BatchBand]:
    """The group's answered bands with the running batch of their best setting's points."""
    out: list[BatchBand] = []
    for b in group["bands"]:
        if b["best"] is None or not isinstance(b["best_steps"], int):
            continue
        if b["best"].startswith("adaptive"):  # its steps change by themselves: no one setting to write down
            notes.append(f"band from {b['level']:g}: the best is an adaptive server ({b['best']}): left out")
            continue
        rows = [
            r
            for r in campaign
            if str(r.workload) == group["workload"]
            and str(r.load_mode) == group["load_mode"]
            and r.level == b["level"]
            and valid(r)
            and cmp.config_label(cmp.Side(run, run.point(r.point), r.point)) == b["best"]
        ]
        if b["missing"]:  # the schedule's own caveat, carried into the engine's words
            notes.append(f"band from {b['level']:g}: no valid point of {', '.join(b['missing'])} there (not ranked)")
        batch = _running(run, rows, series)
        out.append(
            BatchBand(
                level=b["level"],
                best=b["best"],
                steps=b["best_steps"],
                running_batch=batch,
                points=[r.point for r in rows],
            )
        )
    return out


def _cap(run: Run, bands: list[BatchBand], series: dict[str, dict[str, Series]]) -> int:
    """Where the last range ends: the server's max running requests, else the largest batch seen."""
    caps, seen = [], [1.0]
    for b in bands:
        for point in b["points"]:
            limit = effective_limits(run, run.point(point)).max_running_requests
            if isinstance(limit, int) and limit > 0:
                caps.append(limit)
            s = series.get(point, {}).get("running")
            if s is not None and not s.empty:
                seen.append(float(np.max(s.values)) / dp_ranks(run, run.point(point)))
    return max(caps) if caps else math.ceil(max(seen))


def batch_ranges(bands: list[BatchBand], cap: int, notes: list[str]) -> list[list[int]]:
    """[start, end, steps] by running batch: each band from its batch to the next one's, same steps merged."""
    starts: list[tuple[int, int]] = []  # (start, steps)
    below = 0  # the batch the band below measured (the first band's range still starts at 1)
    for b in bands:
        if b["running_batch"] is None:
            continue
        batch = max(1, round(b["running_batch"]))
        start = 1 if not starts else batch
        if starts and batch <= below:
            notes.append(
                f"band from {b['level']:g} ({b['best']}) ran a batch of {b['running_batch']:.1f}, not above the "
                f"band below: merged into it"
            )
            continue
        starts.append((start, b["steps"]))
        below = batch
    out: list[list[int]] = []
    for i, (start, steps) in enumerate(starts):
        end = starts[i + 1][0] - 1 if i + 1 < len(starts) else max(start, cap)
        if out and out[-1][2] == steps:
            out[-1][1] = end
        else:
            out.append([start, end, steps])
    return out


def vllm_problems(ranges: list[list[int]]) -> list[str]:
    """What vLLM's validate_and_normalize_dynamic_sd_schedule would refuse in a 3-item schedule."""
    if not ranges:
        return ["speculative_token_schedule must not be empty."]
    out = []
    prev_end = 0
    for lo, hi, k in ranges:
        if lo <= 0 or hi <= 0:
            out.append(f"Batch-size range ({lo}, {hi}) must be positive.")
        if lo > hi:
            out.append(f"Batch-size range start must be <= end for ({lo}, {hi}, ..., {k}).")
        if k < 0:
            out.append("speculative_token_schedule K values must be >= 0.")
        if lo <= prev_end:
            out.append("Batch-size ranges must be non-overlapping and sorted.")
        prev_end = hi
    if ranges[0][0] != 1:
        out.append("The first batch-size range must start at 1 so every runtime batch size has a defined schedule.")
    return out


def _vllm(
    ranges: list[list[int]], method: str, draft: str | None, model: str, notes: list[str]
) -> tuple[VllmSpeculativeConfig | None, str | None]:
    top = max((k for _, _, k in ranges), default=0)
    if top <= 0:
        notes.append("vLLM: steps 0 is best in every band: serve without --speculative-config")
        return None, None
    problems = vllm_problems(ranges)
    if problems:
        notes.append("vLLM would refuse the schedule: " + " ".join(problems))
        return None, None
    config = VllmSpeculativeConfig(
        method=method, num_speculative_tokens=top, num_speculative_tokens_per_batch_size=ranges
    )
    if draft and method in ("draft_model", "eagle", "eagle3"):
        config["model"] = draft
    command = f"vllm serve {shlex.quote(model)} --speculative-config {shlex.quote(json.dumps(config))}"
    return config, command


def _sglang(
    ranges: list[list[int]], algorithm: str, model: str, file: str, notes: list[str]
) -> tuple[SglangAdaptiveConfig | None, str | None]:
    config = {str(lo): SglangSlot(candidate_steps=[k]) for lo, _, k in ranges}
    union = sorted({k for _, _, k in ranges})
    positive = [k for k in union if k > 0]
    if not positive:
        notes.append("SGLang: steps 0 is best in every band: serve without speculative decoding")
        return None, None
    try:
        slots_of(config)  # SGLang's own checks (_load_adaptive_config)
    except AdaptiveTableError as e:
        notes.append(f"SGLang would refuse the adaptive config: {e}")
        return None, None
    start = ranges[0][2] if ranges[0][2] > 0 else positive[0]  # batch 1's steps; SGLang starts there
    algo = algorithm if algorithm in ADAPTIVE_ALGORITHMS else "EAGLE"
    if algorithm not in ADAPTIVE_ALGORITHMS:
        notes.append(f"SGLang runs adaptive speculation with EAGLE/EAGLE3 only (the run used {algorithm})")
    command = (
        f"python -m sglang.launch_server --model-path {shlex.quote(model)} --speculative-algorithm {algo} "
        f"--speculative-num-steps {start} --speculative-eagle-topk 1 --speculative-num-draft-tokens {start + 1} "
        f"--speculative-adaptive --speculative-adaptive-config {shlex.quote(file)}"
    )
    return config, command


# SGLang's --speculative-algorithm in vLLM's words (speculative_config "method"), for a schedule measured on SGLang
# or the sim and written for vLLM too.
VLLM_METHOD_OF_SGLANG = {
    "NEXTN": "mtp",
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
}


def _vllm_method(run: Run, bands: list[BatchBand]) -> str:
    """The vLLM method of the run's speculation: its own on vLLM, else its SGLang algorithm's (mtp by default)."""
    if _knob(run, bands, "engine", "") == "vllm":
        return _knob(run, bands, "spec_method", "mtp")
    return VLLM_METHOD_OF_SGLANG.get(_knob(run, bands, "spec_algorithm", "NEXTN").upper(), "mtp")


def _knob(run: Run, bands: list[BatchBand], key: str, default: str) -> str:
    """A server knob of the best settings' configurations (the first that has it)."""
    for b in bands:
        for point in b["points"]:
            value = run.server_config(run.point(point).server_config).knobs.get(key)
            if isinstance(value, str) and value:
                return value
    return default


def _engine_schedule(
    run: Run, group: ScheduleGroup, campaign: list[CampaignRow], series: dict[str, dict[str, Series]]
) -> EngineSchedule:
    """One group's bands by running batch, and both engines' configs and command lines."""
    notes: list[str] = []
    bands = _bands(run, group, campaign, series, notes)
    stem = f"{group['workload']}-{group['load_mode']}"
    files = {"vllm": f"{stem}.vllm-speculative-config.json", "sglang": f"{stem}.sglang-adaptive.json"}
    ranges = batch_ranges(bands, _cap(run, bands, series), notes) if bands else []
    if not bands and not notes:
        notes.append(
            "no band of the schedule has a best setting (none valid, or none meets the SLOs): nothing to write"
        )
    elif not ranges:
        notes.append("no running-batch gauge in this run's server metrics: the bands cannot be given by batch")
    model = _knob(run, bands, "model", "MODEL")
    vllm, vllm_cmd = (None, None)
    sgl, sgl_cmd = (None, None)
    if ranges:
        draft = _knob(run, bands, "draft_model_path", "") or None
        vllm, vllm_cmd = _vllm(ranges, _vllm_method(run, bands), draft, model, notes)
        sgl, sgl_cmd = _sglang(ranges, _knob(run, bands, "spec_algorithm", "EAGLE"), model, files["sglang"], notes)
    return EngineSchedule(
        workload=group["workload"],
        load_mode=group["load_mode"],
        bands=bands,
        ranges=ranges,
        vllm_speculative_config=vllm,
        vllm_command=vllm_cmd,
        sglang_adaptive_config=sgl,
        sglang_command=sgl_cmd,
        files=files,
        notes=notes,
    )


def engine_schedules(
    run: Run, schedule: list[ScheduleGroup], campaign: list[CampaignRow], series: dict[str, dict[str, Series]]
) -> list[EngineSchedule]:
    """Per (workload, load mode) of the schedule: its bands by running batch in vLLM's and SGLang's words."""
    return [_engine_schedule(run, group, campaign, series) for group in schedule]


def write_engine_files(schedules: list[EngineSchedule], out_dir: Path) -> list[Path]:
    """Each schedule's vLLM speculative config and SGLang adaptive config as JSON files in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in schedules:
        for engine, config in (("vllm", s["vllm_speculative_config"]), ("sglang", s["sglang_adaptive_config"])):
            if config is None:
                continue
            path = out_dir / s["files"][engine]
            path.write_text(json.dumps(config, indent=2) + "\n")
            paths.append(path)
    return paths


def range_rows(schedules: list[EngineSchedule]) -> list[EngineRangeRow]:
    """Every schedule's batch-size ranges as flat rows."""
    return [
        EngineRangeRow(workload=s["workload"], load_mode=s["load_mode"], start=lo, end=hi, steps=k)
        for s in schedules
        for lo, hi, k in s["ranges"]
    ]
