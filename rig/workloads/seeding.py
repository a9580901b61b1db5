"""Seed streams for workloads: one independent generator per (workload, stream, session index).

Deriving every session's generator from ``SeedSequence([seed, workload tag, stream, index])`` (rather than drawing
sessions one after another from a single generator) is what makes ``build_sessions`` prefix-stable: session i never
depends on how many sessions were asked for, nor on what sessions before it drew.
"""

from __future__ import annotations

import zlib

import numpy as np

MAIN = 0  # measured sessions
WARMUP = 1  # warm-up sessions: a separate stream so they never collide with measured ones


def _tag(name: str) -> int:
    """A stable 32-bit tag for a workload name (crc32: not Python's randomized hash)."""
    return zlib.crc32(name.encode())


def session_rng(seed: int, name: str, index: int, stream: int = MAIN) -> np.random.Generator:
    """The generator for one session: depends only on (seed, name, stream, index)."""
    return np.random.default_rng(np.random.SeedSequence([seed, _tag(name), stream, index]))


def request_seed(rng: np.random.Generator) -> int:
    """A per-request sampling seed for the server (31 bits: fits every engine's int seed field)."""
    return int(rng.integers(0, 2**31 - 1))
