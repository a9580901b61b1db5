"""Which label sets of one /metrics sample name add up to the server's total, and which repeat it.

A request gauge summed over every label set counts a request once per set that reports it. SGLang labels its
scheduler's metrics with the scheduler's ranks (``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``dp_rank`` with DP
attention: ``srt/metrics/collector.py`` SchedulerMetricsCollector takes them as ``labels``); only the first rank of
each attention-TP group logs them unless ``--enable-metrics-for-all-schedulers`` is set, and then every TP rank of
the group reports the same batch. Per-priority series (a ``priority`` label) come beside the total, whose
``priority`` is empty (issue 32's audit of 0.5.23). So of the label sets that differ only by ``tp_rank`` the lowest
rank is kept (``tp_rank="0"`` without DP attention; each DP rank's own leader with it), and of those that carry
``priority`` only the empty one; everything else (DP ranks, ``is_streaming``) still adds up.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping


def _rank(v: str) -> tuple[int, str]:
    return (int(v), v) if v.isdigit() else (1 << 30, v)


def kept_label_sets(label_sets: Iterable[Mapping[str, str]]) -> list[bool]:
    """For each label set (in order), whether it counts toward the name's total."""
    sets = list(label_sets)
    lowest: dict[tuple[tuple[str, str], ...], tuple[int, str]] = {}
    for labels in sets:
        if "tp_rank" in labels:
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "tp_rank"))
            rank = _rank(labels["tp_rank"])
            lowest[rest] = min(lowest.get(rest, rank), rank)
    out = []
    for labels in sets:
        if labels.get("priority", "") != "":
            out.append(False)
        elif "tp_rank" in labels:
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "tp_rank"))
            out.append(_rank(labels["tp_rank"]) == lowest[rest])
        else:
            out.append(True)
    return out


def kept_label_json(label_jsons: Iterable[str]) -> set[str]:
    """Of the distinct labels (as rig stores them: sorted JSON objects), the ones that count."""
    uniq = list(dict.fromkeys(label_jsons))
    parsed = []
    for text in uniq:
        try:
            obj = json.loads(text) if text else {}
        except ValueError:
            obj = {}
        parsed.append({str(k): str(v) for k, v in obj.items()} if isinstance(obj, dict) else {})
    return {text for text, keep in zip(uniq, kept_label_sets(parsed), strict=True) if keep}


def kept_samples(samples: Iterable[tuple[str, str, float]]) -> list[bool]:
    """For each (name, labels JSON, value) sample of a scrape, whether it counts toward its name's total."""
    rows = list(samples)
    by_name: dict[str, list[str]] = {}
    for name, labels, _value in rows:
        by_name.setdefault(name, []).append(labels)
    kept = {name: kept_label_json(labels) for name, labels in by_name.items()}
    return [labels in kept[name] for name, labels, _value in rows]
