"""The campaign's benchmark: a few fixed prompts of our own, temperature 0, ignore_eos, about 1,000 output tokens.

Request i uses template ``i % 6``. The per-template max_tokens (1000, 1000, 1000, 1000, 875, 625) are chosen so the
campaign's request counts give its Tokens column: the first 4 requests (C=1) total 4,000 and the first 64 (C=32)
59,000, both exactly as in rig/sim/data/campaign.yaml; 8 requests give 7,500 (campaign 7,441), 32 give 29,500 (29,798),
128 give 117,500 (112,000). The campaign's own script is not available, so this is the closest shape, not a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

from rig.workloads.base import Session, Turn
from rig.workloads.seeding import request_seed, session_rng
from rig.workloads.spec import WorkloadSpec

TEMPLATES: tuple[tuple[str, int], ...] = (
    (
        "Write a detailed technical essay on how a modern CPU executes instructions: pipelining, branch prediction, "
        "out-of-order execution, caches and the memory hierarchy. Use section headings and concrete examples.",
        1000,
    ),
    (
        "Explain, step by step, how to implement a hash map from scratch in Python, including hashing, collision "
        "handling with open addressing, resizing, deletion, and the complexity of each operation. Include the code.",
        1000,
    ),
    (
        "Tell a long story about a cartographer who discovers that the maps she draws change the land they describe. "
        "Give the story a beginning, a middle and an end, with dialogue.",
        1000,
    ),
    (
        "Write a complete beginner's guide to growing vegetables on a balcony: choosing containers, soil, sunlight, "
        "watering, which vegetables to start with, a month-by-month calendar, and common problems with their fixes.",
        1000,
    ),
    (
        "Describe the history of the Roman Empire from the founding of the Republic to the fall of the West, "
        "organised by century, with the main political, military and economic changes in each.",
        875,
    ),
    (
        "Write a tutorial on SQL joins for analysts: inner, left, right, full and cross joins, each with a small "
        "example table, the query, its result, and a common mistake to avoid.",
        625,
    ),
)


def build(spec: WorkloadSpec, seed: int, indices: Sequence[int], id_prefix: str, stream: int) -> list[Session]:
    """Sessions ``indices`` of the greedy workload (one turn each)."""
    out = []
    for i in indices:
        rng = session_rng(seed, spec.name, i, stream)
        prompt, max_tokens = TEMPLATES[i % len(TEMPLATES)]
        sid = f"{id_prefix}-{i:06d}"
        turn = Turn(
            request_id=f"{sid}-t0",
            messages=({"role": "user", "content": prompt},),
            max_tokens=spec.max_tokens or max_tokens,
            **spec.sampling(),
            seed=request_seed(rng),
            category="greedy",
        )
        out.append(Session(session_id=sid, turns=(turn,), extra={"template": i % len(TEMPLATES)}))
    return out
