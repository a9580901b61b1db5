"""vLLM's speculative schedule by batch size (``num_speculative_tokens_per_batch_size``): read and validated as vLLM
validates it, so a schedule vLLM would refuse is refused here in one line, before any launch.

The schedule is a list of inclusive batch-size ranges ``[[start, end, K], ...]`` (vllm/config/speculative.py:491).
vLLM 0.32.0 (vllm/v1/spec_decode/dynamic/utils.py, validate_and_normalize_dynamic_sd_schedule): each entry has
three integers, both ends positive, start <= end, K >= 0; the entries, sorted by start, must not overlap; the first
starts at 1. At launch the scheduler expands it into a dense lookup up to max_num_seqs
(build_dynamic_sd_schedule_lookup, called from vllm/v1/core/sched/scheduler.py:307-315): a gap carries the previous
range's K, batches past the last range keep its K, every K is clamped to num_speculative_tokens; each step then
speculates ``lookup[number of scheduled requests]`` tokens (scheduler.py:1485-1490; K=0: no speculation that step).

Written forms: vLLM's own JSON list (``[[1,2,4],[3,64,1]]``), the compact ``1-2:4,3-64:1``, or a JSON/YAML file
holding that list (or a mapping with ``num_speculative_tokens_per_batch_size``, as in a speculative config).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

Schedule = tuple[tuple[int, int, int], ...]
KEY = "num_speculative_tokens_per_batch_size"
_COMPACT_ENTRY = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*$")
FORMS = "give [[start, end, K], ...] as JSON, START-END:K,... (e.g. 1-2:4,3-64:1) or a file holding the list"


def parse(value: object) -> Schedule:
    """A schedule from any of its written forms, validated with vLLM's rules (ValueError: one line)."""
    if isinstance(value, str):
        value = _from_text(value)
    if isinstance(value, dict):
        if KEY not in value:
            raise ValueError(f"a mapping needs the key {KEY}; {FORMS}")
        value = value[KEY]
    return validate(value)


def _from_text(text: str) -> object:
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"empty; {FORMS}")
    if stripped[:1] in "[{":
        try:
            return json.loads(stripped)
        except ValueError as e:
            raise ValueError(f"not JSON ({e}); {FORMS}") from None
    entries = [_COMPACT_ENTRY.match(part) for part in stripped.split(",")]
    if all(entries):
        return [[int(g) for g in m.groups()] for m in entries if m]
    path = Path(stripped).expanduser()
    if path.is_file():
        try:
            return yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ValueError(f"{path}: cannot read a schedule ({str(e).splitlines()[0]})") from None
    raise ValueError(f"{text!r} is neither a schedule nor a file; {FORMS}")


def validate(value: object) -> Schedule:
    """vLLM 0.32.0's rules (validate_and_normalize_dynamic_sd_schedule), entries sorted by start as vLLM sorts them."""
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"a schedule is a non-empty list of [start, end, K] entries; {FORMS}")
    entries = []
    for entry in value:
        if not isinstance(entry, list | tuple) or len(entry) != 3 or not all(_is_int(x) for x in entry):
            raise ValueError(f"entry {_show(entry)} is not [start, end, K] (three integers)")
        start, end, k = (int(x) for x in entry)
        if start <= 0 or end <= 0:
            raise ValueError(f"entry {_show(entry)}: batch-size range ({start}, {end}) must be positive")
        if start > end:
            raise ValueError(f"entry {_show(entry)}: batch-size range start must be <= end")
        if k < 0:
            raise ValueError(f"entry {_show(entry)}: K must be >= 0 (0: no speculation in that range)")
        entries.append((start, end, k))
    entries.sort(key=lambda e: e[0])
    previous_end = 0
    for start, end, _ in entries:
        if start <= previous_end:
            raise ValueError(f"batch-size ranges overlap: {start} falls in a range that ends at {previous_end}")
        previous_end = end
    if entries[0][0] != 1:
        raise ValueError(f"the first batch-size range must start at 1 (it starts at {entries[0][0]}), as vLLM requires")
    return tuple(entries)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _show(entry: object) -> str:
    return json.dumps(entry) if isinstance(entry, list | tuple | int | str) else repr(entry)


def max_k(schedule: Schedule) -> int:
    """The largest K: the num_speculative_tokens a schedule needs when steps is not given."""
    return max(k for _, _, k in schedule)


def as_json(schedule: Schedule) -> list[list[int]]:
    """The list vLLM's --speculative-config takes."""
    return [list(e) for e in schedule]


def label(schedule: Schedule) -> str:
    """A short readable form, e.g. ``1-1:3,2-64:1`` (the compact form parse reads)."""
    return ",".join(f"{s}-{e}:{k}" for s, e, k in schedule)


def k_for(schedule: Schedule, batch: int, steps: int) -> int:
    """K at one batch size as vLLM's dense lookup gives it: a gap or the tail carries the previous range's K, and K
    is clamped to num_speculative_tokens (build_dynamic_sd_schedule_lookup)."""
    current = 0
    for start, end, k in schedule:
        if start > batch:
            break
        current = k
        if batch <= end:
            break
    return min(current, steps)


def _flag_int(argv: tuple[str, ...], *flags: str) -> int | None:
    """An integer flag's value in an argv (``--flag N`` or ``--flag=N``), None when absent or not a number."""
    for i, a in enumerate(argv):
        name, sep, value = a.partition("=")
        if name in flags:
            text = value if sep else (argv[i + 1] if i + 1 < len(argv) else "")
            return int(text) if text.isdigit() else None
    return None


def refusal(schedule: Schedule, engine: str, steps: int, extra_args: tuple[str, ...]) -> str | None:
    """Why a schedule would not run as written on this launch (one line), or None."""
    if engine not in ("vllm", "external"):  # external: a vLLM server you run, its schedule recorded as its steps are
        return (
            f"spec_schedule is vLLM's num_speculative_tokens_per_batch_size (engine vllm, or external to record what "
            f"a server you run uses); engine {engine} does not take it"
        )
    top = max_k(schedule)
    if steps > 0 and top > steps:
        start, end, _ = next(e for e in schedule if e[2] == top)
        return (
            f"spec_schedule runs K={top} at batch sizes {start}-{end} but steps is {steps}: vLLM clamps every K to "
            f"num_speculative_tokens (build_dynamic_sd_schedule_lookup), so that range would run {steps}; give steps "
            f">= {top} or leave steps out (it defaults to the largest K)"
        )
    dp = _flag_int(extra_args, "--data-parallel-size", "-dp")
    if dp is not None and dp > 1:
        return (
            f"spec_schedule with --data-parallel-size {dp}: vLLM turns the schedule off under data parallelism and "
            "runs fixed num_speculative_tokens (vllm/config/vllm.py:1058-1075, _maybe_disable_dynamic_sd_for_data_"
            "parallel)"
        )
    return None


def steps_for(schedule: Schedule, given: list[int] | None) -> list[int]:
    """The steps values a scheduled launch runs: the given ones, else the largest K (ValueError: none speculates).
    Steps 0 beside others is the no-speculation baseline, which runs without the schedule."""
    if given is None:
        if max_k(schedule) == 0:
            raise ValueError("spec_schedule: every K is 0 (no speculation anywhere); give steps >= 1 as well")
        return [max_k(schedule)]
    if all(s == 0 for s in given):
        raise ValueError("spec_schedule needs steps >= 1 (steps 0 runs no speculation, so no schedule)")
    return given
