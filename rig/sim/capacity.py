"""Memory accounting: how many tokens the KV pool holds and how many requests may run, from the profile and flags.

Qwen3.5 is a hybrid model: most layers are linear attention (GDN) with a fixed-size recurrent state per request,
and speculative verification keeps an intermediate state per draft token for rollback. So every running request
reserves state that grows with the draft length, and the number of requests that fit falls as steps rise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rig.sim.profile import Profile


class CapacityError(ValueError):
    """The configuration does not fit in memory (SGLang fails at startup the same way)."""


@dataclass(frozen=True)
class Capacity:
    max_total_num_tokens: int  # KV pool, tokens
    max_running_requests: int  # effective limit the scheduler uses
    state_limit: int  # requests the recurrent-state pool holds
    configured_max_running: int  # the flag's value (or its default)
    available_gpu_mem_gb: float  # left after static allocation, per GPU
    weight_gb_per_gpu: float
    kv_pool_gb: float
    state_pool_gb: float
    state_mb_per_request: float


def default_max_running(tokens: int, context_len: int) -> int:
    """SGLang's derived default when not speculating (kv_cache_configurator.resolve_max_num_reqs)."""
    return int(min(max(min(tokens / context_len * 512, 4096), 2048), tokens // 2))


def compute_capacity(
    profile: Profile,
    *,
    tp: int,
    mem_fraction_static: float | None,
    draft_tokens: int,
    speculative: bool,
    max_running_requests: int | None,
    max_total_tokens: int | None,
    context_length: int,
) -> Capacity:
    """Split static GPU memory into weights, KV pool and request-state pool; derive the two limits."""
    mf = mem_fraction_static if mem_fraction_static is not None else profile.default_mem_fraction_static
    shard = profile.calibrated_tp / tp  # per-GPU state and KV shrink as heads are split over more GPUs
    weights = profile.weight_gb_total / tp
    left = profile.gpu_mem_gb * mf - weights - profile.graph_reserve_gb
    if left <= 0:
        raise CapacityError(
            f"Not enough memory: weights take {weights:.1f} GB per GPU of {profile.gpu_mem_gb * mf:.1f} GB "
            f"(mem_fraction_static={mf}); raise --mem-fraction-static or --tp-size"
        )
    state_gb = left * profile.state_pool_share
    kv_gb = left - state_gb
    tokens = int(kv_gb * 1e9 / (profile.kv_bytes_per_token * shard))
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    per_req_mb = (
        profile.state_mb_base + (profile.state_mb_per_draft_token * draft_tokens if speculative else 0.0)
    ) * shard
    state_limit = max(1, math.floor(state_gb * 1000.0 / per_req_mb))
    if max_running_requests is not None:
        configured = max_running_requests
    elif speculative:
        configured = 48
    else:
        configured = default_max_running(tokens, context_length)
    effective = max(1, min(configured, state_limit, max(1, tokens // 2)))
    available = max(0.0, profile.gpu_mem_gb * (1.0 - mf))
    return Capacity(
        max_total_num_tokens=tokens,
        max_running_requests=effective,
        state_limit=state_limit,
        configured_max_running=configured,
        available_gpu_mem_gb=round(available, 2),
        weight_gb_per_gpu=round(weights, 2),
        kv_pool_gb=round(kv_gb, 2),
        state_pool_gb=round(state_gb, 2),
        state_mb_per_request=round(per_req_mb, 2),
    )
