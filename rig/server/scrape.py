"""Parsing Prometheus text from an engine's /metrics with prometheus_client's parser."""

from __future__ import annotations

import json
import math

from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> list[tuple[str, str, float]]:
    """(sample name, labels as sorted JSON, value) for every sample; histogram buckets are dropped (too many rows;
    _sum and _count are kept), as are ``_created`` timestamps."""
    out: list[tuple[str, str, float]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            value = float(s.value)
            if math.isnan(value):
                continue
            out.append((s.name, json.dumps(dict(sorted(s.labels.items()))), value))
    return out


def summed_values(samples: list[tuple[str, str, float]]) -> dict[str, float]:
    """Sum each sample name over its label sets (e.g. a counter split by tp_rank or is_streaming)."""
    total: dict[str, float] = {}
    for name, _labels, value in samples:
        total[name] = total.get(name, 0.0) + value
    return total
