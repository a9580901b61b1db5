"""Clock offsets: each generator's (and the server node's) clock against the driver's, from the lowest-RTT ping."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, NotRequired, TypedDict

import ray

from rig.contracts import GeneratorEntry


def best_offset(samples: Iterable[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset, rtt) from (t_send, t_remote, t_recv) samples: the lowest-RTT one wins.

    offset = remote clock - driver clock, so a remote timestamp ts is ``ts - offset`` on the driver's clock.
    """
    best: tuple[float, float] | None = None
    for t0, t_remote, t1 in samples:
        rtt = t1 - t0
        if best is None or rtt < best[1]:
            best = (t_remote - (t0 + t1) / 2, rtt)
    if best is None:
        raise ValueError("no clock samples")
    return best


def measure_clock_offset(actor: Any, pings: int = 15) -> tuple[float, float]:
    """(offset, rtt) of an actor's clock against the driver's, from the lowest-RTT of several pings."""
    ray.get(actor.clock.remote())  # warm the path (first call pays connection setup)
    samples = []
    for _ in range(pings):
        t0 = time.time()
        t_actor = ray.get(actor.clock.remote())
        samples.append((t0, t_actor, time.time()))
    return best_offset(samples)


class HostClock(TypedDict):
    """One client host's clock against the driver's (its lowest-RTT generator's) and its generators."""

    host: str
    node_id: str | None
    generators: list[int]
    clock_offset_s: NotRequired[float]
    clock_rtt_s: NotRequired[float]
    clock_uncertainty_s: NotRequired[float]  # half the RTT: how far the offset can be off


def host_clocks(gen_info: list[GeneratorEntry]) -> dict[str, HostClock]:
    """Per client host (node IP): its clock offset and RTT (from its lowest-RTT generator) and its generators."""
    hosts: dict[str, HostClock] = {}
    for g in gen_info:
        key = g.get("node_ip") or g.get("host") or "?"
        h = hosts.setdefault(key, {"host": g.get("host"), "node_id": g.get("node_id"), "generators": []})
        h["generators"].append(g["generator"])
        rtt, offset = g.get("clock_rtt_s"), g.get("clock_offset_s")
        if rtt is not None and offset is not None and (h.get("clock_rtt_s") is None or rtt < h["clock_rtt_s"]):
            h["clock_offset_s"], h["clock_rtt_s"] = offset, rtt
            h["clock_uncertainty_s"] = rtt / 2
    return hosts
