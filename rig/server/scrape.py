"""Parsing Prometheus text from an engine's /metrics with prometheus_client's parser."""

from __future__ import annotations

import json
import math
import time

from prometheus_client.parser import text_string_to_metric_families

from rig.contracts.label_sets import kept_samples
from rig.contracts.live import (
    GEN_THROUGHPUT_GAUGES,
    LIVE_GAUGES,
    QUEUED_GAUGES,
    RUNNING_GAUGES,
    SPEC_STEPS_GAUGES,
    ServerGauges,
    first_present,
)


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
    """Sum each sample name over the label sets that add up (is_streaming, DP ranks; not a TP rank's copy)."""
    total: dict[str, float] = {}
    # a rank's or a priority's copy of the total is not added to it (rig.contracts.label_sets)
    for (name, _labels, value), keep in zip(samples, kept_samples(samples), strict=True):
        if keep:
            total[name] = total.get(name, 0.0) + value
    return total


def live_gauges(samples: list[tuple[str, str, float]]) -> dict[str, float]:
    """The live view's gauges of one scrape: requests and throughput summed over label sets (DP ranks), the
    speculative steps the largest any rank reports (every rank runs the same)."""
    out: dict[str, float] = {}
    live = [s for s in samples if s[0] in LIVE_GAUGES]
    for (name, _labels, value), keep in zip(live, kept_samples(live), strict=True):
        if not keep:
            continue
        if name in SPEC_STEPS_GAUGES:
            out[name] = max(out.get(name, value), value)
        else:
            out[name] = out.get(name, 0.0) + value
    return out


class LastGauges:
    """The live view's gauges of the last scrape that answered, and when it was taken."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.values: dict[str, float] = {}

    def seen(self, samples: list[tuple[str, str, float]]) -> None:
        if samples:
            self.at, self.values = time.monotonic(), live_gauges(samples)

    def answer(self, power_w: float | None) -> ServerGauges:
        if self.at is None:
            return ServerGauges(power_w=power_w)
        g = self.values
        return ServerGauges(
            running=first_present(g, RUNNING_GAUGES),
            queued=first_present(g, QUEUED_GAUGES),
            spec_steps=first_present(g, SPEC_STEPS_GAUGES),
            gen_throughput=first_present(g, GEN_THROUGHPUT_GAUGES),
            power_w=power_w,
            age_s=time.monotonic() - self.at,
        )
